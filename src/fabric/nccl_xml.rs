//! Import of the XML topology that NCCL writes with `NCCL_TOPO_DUMP_FILE`.
