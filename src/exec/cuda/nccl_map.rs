//! What NCCL must be told to run the algorithm a schedule was built for: the
//! `NCCL_ALGO`/`NCCL_PROTO` values (NCCL's own spellings, as its environment documentation
//! lists them) and the other variables that keep NCCL from switching to another algorithm.
//! No GPU needed; the NCCL timing in `nccl.rs` applies these before it creates its
//! communicators.

use crate::collective::{Algo, Collective};
use crate::schedule::Proto;

/// `NCCL_ALGO`'s value for an algorithm, or `None` for point-to-point (no algorithm choice).
pub fn nccl_algo(a: Algo) -> Option<&'static str> {
    Some(match a {
        Algo::Tree => "Tree",
        Algo::Ring => "Ring",
        Algo::CollNetDirect => "CollnetDirect",
        Algo::CollNetChain => "CollnetChain",
        Algo::Nvls => "NVLS",
        Algo::NvlsTree => "NVLSTree",
        Algo::Pat => "PAT",
        Algo::P2p => return None,
    })
}

/// `NCCL_PROTO`'s value for a protocol.
pub fn nccl_proto(p: Proto) -> &'static str {
    p.name()
}

/// Every environment variable to set, in order, so that NCCL runs `algo` with `proto`:
/// the two choices, and the enables the algorithm needs (NVLS and CollNet are off unless
/// asked for, and on when the algorithm is one of theirs).
pub fn nccl_env(algo: Algo, proto: Proto) -> Vec<(&'static str, String)> {
    let mut v = Vec::new();
    if let Some(a) = nccl_algo(algo) {
        v.push(("NCCL_ALGO", a.to_string()));
    }
    v.push(("NCCL_PROTO", nccl_proto(proto).to_string()));
    let nvls = matches!(algo, Algo::Nvls | Algo::NvlsTree);
    let collnet = matches!(algo, Algo::CollNetDirect | Algo::CollNetChain);
    v.push(("NCCL_NVLS_ENABLE", if nvls { "1" } else { "0" }.to_string()));
    v.push(("NCCL_COLLNET_ENABLE", if collnet { "1" } else { "0" }.to_string()));
    v
}

/// Whether the collective is one NCCL call on every rank (all but all-to-all and
/// send/recv, which are grouped point-to-point calls).
pub fn single_call(c: Collective) -> bool {
    !matches!(c, Collective::AllToAll | Collective::SendRecv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_algorithm_maps_to_nccls_spelling() {
        // NCCL parses NCCL_ALGO case-insensitively; these are the names its documentation uses.
        let names: Vec<_> = Algo::NCCL.iter().map(|&a| nccl_algo(a).unwrap()).collect();
        assert_eq!(names, ["Tree", "Ring", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT"]);
        assert_eq!(nccl_algo(Algo::P2p), None);
        assert_eq!(nccl_proto(Proto::LL128), "LL128");
        let env = nccl_env(Algo::Nvls, Proto::Simple);
        assert_eq!(
            env,
            vec![
                ("NCCL_ALGO", "NVLS".to_string()),
                ("NCCL_PROTO", "Simple".to_string()),
                ("NCCL_NVLS_ENABLE", "1".to_string()),
                ("NCCL_COLLNET_ENABLE", "0".to_string())
            ]
        );
        assert!(nccl_env(Algo::P2p, Proto::LL).iter().all(|(k, _)| *k != "NCCL_ALGO"));
        assert!(single_call(Collective::AllReduce) && !single_call(Collective::AllToAll));
    }
}
