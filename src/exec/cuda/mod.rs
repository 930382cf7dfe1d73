//! The CUDA backend: runs the very schedule the simulator times on real GPUs, and measures
//! what the GPU model needs.
//!
//! Two halves:
//! - **GPU-free, always built and tested:** the lowering of a schedule to a GPU plan
//!   (copies, reduction kernels and event waits per stream, buffer layout; [`plan`]) with a
//!   host emulator of the plan, the NVRTC source of the reduction kernels per type and
//!   operator ([`kernels`]), and the `NCCL_ALGO`/`NCCL_PROTO` mapping ([`nccl_map`]); for
//!   runs across nodes, the plan split among processes with NCCL send/recv between them
//!   ([`dist`]), the launcher's environment ([`launch`]) and the TCP rendezvous that
//!   exchanges NCCL's unique id and gathers the results ([`rendezvous`]).
//! - **Behind the `cuda` cargo feature:** the driver, NVRTC, cuBLAS and NCCL loaded at run
//!   time through cudarc's dynamic loading (`driver.rs`: loading, device discovery, peer
//!   matrix and peer bandwidth), the plan's executor with a bit-for-bit check against the
//!   CPU executor and CUDA-event timing (`run.rs`), NCCL's own collective with the
//!   schedule's algorithm (`nccl.rs`), and one-GPU microbenchmarks (`bench.rs`).
//!
//! Every missing library, absent GPU or failing call is a [`CudaError`] that says what is
//! missing and how to get it; cudarc panics instead of erroring when a library or a symbol
//! is missing, so every entry point checks the library first and runs under
//! `catch_unwind` as a last line of defence.
//!
//! Architecture invariant: like every backend, this one consumes a schedule and knows
//! nothing of the algorithm that built it; only [`nccl_map`] names algorithms, to tell
//! NCCL which one to compare with.

pub mod dist;
pub mod kernels;
pub mod launch;
pub mod nccl_map;
pub mod plan;
pub mod rendezvous;

#[cfg(feature = "cuda")]
pub mod bench;
#[cfg(feature = "cuda")]
pub mod driver;
#[cfg(feature = "cuda")]
pub mod nccl;
#[cfg(feature = "cuda")]
pub mod run;

/// A CUDA library fabricsim loads at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Library {
    /// The driver API (`libcuda.so.1`, installed with the NVIDIA driver).
    Driver,
    /// The run-time compiler (`libnvrtc.so`).
    Nvrtc,
    /// cuBLAS (`libcublas.so`).
    Cublas,
    /// NCCL (`libnccl.so`).
    Nccl,
}

impl Library {
    /// The name cudarc searches for, without prefix and suffix.
    pub fn stem(self) -> &'static str {
        match self {
            Library::Driver => "cuda",
            Library::Nvrtc => "nvrtc",
            Library::Cublas => "cublas",
            Library::Nccl => "nccl",
        }
    }
    /// How to get the library.
    pub fn hint(self) -> &'static str {
        match self {
            Library::Driver => {
                "install the NVIDIA driver (it provides libcuda.so.1), or add the folder holding \
                 libcuda.so.1 to LD_LIBRARY_PATH"
            }
            Library::Nvrtc => {
                "install the CUDA toolkit's NVRTC (the cuda-nvrtc package, or `pip install \
                 nvidia-cuda-nvrtc-cu12`) and add the folder holding libnvrtc.so to LD_LIBRARY_PATH"
            }
            Library::Cublas => {
                "install cuBLAS (the libcublas package, or `pip install nvidia-cublas-cu12`) and add \
                 the folder holding libcublas.so to LD_LIBRARY_PATH"
            }
            Library::Nccl => {
                "install NCCL (libnccl2 and libnccl-dev, or `pip install nvidia-nccl-cu12`); cudarc looks \
                 for libnccl.so but NCCL's runtime package ships only libnccl.so.2: make a folder with \
                 the link libnccl.so -> libnccl.so.2 and put it first in LD_LIBRARY_PATH \
                 (validate/gpu/run.sh does this)"
            }
        }
    }
}

impl std::fmt::Display for Library {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Library::Driver => "the CUDA driver",
            Library::Nvrtc => "NVRTC",
            Library::Cublas => "cuBLAS",
            Library::Nccl => "NCCL",
        })
    }
}

/// Why the CUDA backend cannot do what was asked.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CudaError {
    /// fabricsim was built without the `cuda` feature.
    #[error("built without the cuda feature; rebuild with --features cuda")]
    NotBuilt,
    /// A library is not installed or not on the search path.
    #[error("{lib} was not found (searched {searched}); {hint}", hint = lib.hint())]
    Missing {
        /// Which library.
        lib: Library,
        /// The file names searched, comma-separated.
        searched: String,
    },
    /// The driver loaded but reports no GPU.
    #[error("the CUDA driver found no GPU (device count 0); check nvidia-smi and CUDA_VISIBLE_DEVICES")]
    NoDevice,
    /// Fewer GPUs than asked for.
    #[error("{want} GPUs were asked for but {have} are visible")]
    TooFewDevices {
        /// Asked for.
        want: u32,
        /// Visible.
        have: u32,
    },
    /// A call into a CUDA library failed.
    #[error("{call} failed: {msg}")]
    Call {
        /// The call.
        call: String,
        /// The library's message.
        msg: String,
    },
    /// A library panicked inside cudarc (a missing symbol in an older library, typically).
    #[error("{what}: the CUDA library call aborted ({msg}); the installed library may be older than the 12.8 API fabricsim binds (check the driver with nvidia-smi)")]
    Panicked {
        /// What was being done.
        what: String,
        /// The panic message.
        msg: String,
    },
    /// NVRTC rejected the generated source.
    #[error("NVRTC could not compile the reduction kernels: {0}")]
    Compile(String),
    /// The schedule could not be lowered.
    #[error(transparent)]
    Plan(#[from] plan::PlanError),
    /// The GPU's result differs from the CPU executor's.
    #[error("the GPU result differs from the CPU executor: {0}")]
    Mismatch(String),
    /// Anything else about the request.
    #[error("{0}")]
    Invalid(String),
}

/// Runs `f`, turning a panic inside a CUDA library binding into [`CudaError::Panicked`]:
/// cudarc panics on a missing library or symbol instead of returning an error.
pub fn guard<T>(what: &str, f: impl FnOnce() -> Result<T, CudaError>) -> Result<T, CudaError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "no message".into());
            Err(CudaError::Panicked { what: what.to_string(), msg })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_that_says_what_was_done() {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let e = guard::<()>("loading NCCL", || panic!("Missing symbol ncclCommInitAll")).unwrap_err();
        std::panic::set_hook(prev);
        assert!(
            e.to_string()
                .starts_with("loading NCCL: the CUDA library call aborted (Missing symbol ncclCommInitAll)"),
            "{e}"
        );
        assert_eq!(guard("x", || Ok(3)).unwrap(), 3);
    }

    #[test]
    fn missing_libraries_say_how_to_get_them() {
        let e = CudaError::Missing { lib: Library::Nccl, searched: "libnccl.so".into() };
        let m = e.to_string();
        assert!(m.starts_with("NCCL was not found (searched libnccl.so); install NCCL"), "{m}");
        assert!(m.contains("libnccl.so -> libnccl.so.2"), "{m}");
        assert_eq!(
            CudaError::NotBuilt.to_string(),
            "built without the cuda feature; rebuild with --features cuda"
        );
    }
}
