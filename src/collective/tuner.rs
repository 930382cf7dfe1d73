//! NCCL tuner (in progress)
