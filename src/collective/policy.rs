//! NCCL's environment as it constrains NCCL's own choice of algorithm, protocol and channels
//! for a collective whose caller lets NCCL pick (the training layer's collectives):
//! `NCCL_ALGO` and `NCCL_PROTO` per collective, `NCCL_NVLS_ENABLE`, `NCCL_COLLNET_ENABLE`,
//! `NCCL_MIN_NCHANNELS` and `NCCL_MAX_NCHANNELS`; and `NCCL_IB_ADAPTIVE_ROUTING`, which the
//! router of whoever prices under the policy reads. Parsing the variables is the scenario
//! layer's (`scenario::nccl_env`); this is what the pick reads.

use super::{Algo, Collective, Comm};
use crate::fabric::NetSettings;
use crate::schedule::Proto;

/// What NCCL's environment allows the pick of one collective.
#[derive(Clone, Debug, PartialEq)]
pub struct NcclPolicy {
    /// Per collective, the algorithms `NCCL_ALGO` allows (a collective not listed, or an
    /// empty list: all).
    pub algos: Vec<(Collective, Vec<Algo>)>,
    /// Per collective, the protocols `NCCL_PROTO` allows (likewise).
    pub protos: Vec<(Collective, Vec<Proto>)>,
    /// `NCCL_NVLS_ENABLE` (NVLS and NVLS-Tree; NCCL's default: on).
    pub nvls: bool,
    /// `NCCL_COLLNET_ENABLE` (CollNet, and NVLS across nodes, on a fabric with SHARP;
    /// NCCL's default: off).
    pub collnet: bool,
    /// `NCCL_MIN_NCHANNELS`.
    pub min_channels: Option<u32>,
    /// `NCCL_MAX_NCHANNELS`.
    pub max_channels: Option<u32>,
    /// How the network transport uses the fabric (`NCCL_IB_ADAPTIVE_ROUTING`,
    /// `NCCL_IB_QPS_PER_CONNECTION`, `NCCL_NET_GDR_LEVEL`).
    pub net: NetSettings,
    /// Whose ranking constants pick (`NCCL_VERSION`, fabricsim's own variable: the NCCL
    /// release that ran).
    pub tuner: super::tuner::TunerVersion,
}

impl Default for NcclPolicy {
    fn default() -> Self {
        NcclPolicy {
            algos: Vec::new(),
            protos: Vec::new(),
            nvls: true,
            collnet: false,
            min_channels: None,
            max_channels: None,
            net: NetSettings::default(),
            tuner: super::tuner::TunerVersion::default(),
        }
    }
}

impl NcclPolicy {
    /// Whether `NCCL_ALGO` and `NCCL_PROTO` allow `algo` with `proto` for `coll`.
    pub fn allows(&self, coll: Collective, algo: Algo, proto: Proto) -> bool {
        fn ok<T: PartialEq>(rules: &[(Collective, Vec<T>)], coll: Collective, x: T) -> bool {
            rules.iter().find(|(c, _)| *c == coll).is_none_or(|(_, l)| l.is_empty() || l.contains(&x))
        }
        ok(&self.algos, coll, algo) && ok(&self.protos, coll, proto)
    }

    /// Whether CollNet may run on `comm` (its fabric has SHARP and the policy allows it).
    pub fn collnet_on(&self, comm: &Comm) -> bool {
        comm.sharp && self.collnet
    }

    /// `nchannels` within `NCCL_MIN_NCHANNELS` and `NCCL_MAX_NCHANNELS`.
    pub fn channels(&self, nchannels: u32) -> u32 {
        let n = self.max_channels.map_or(nchannels, |m| nchannels.min(m.max(1)));
        self.min_channels.map_or(n, |m| n.max(m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_restrict_only_their_collective() {
        let p = NcclPolicy {
            algos: vec![(Collective::AllReduce, vec![Algo::Ring])],
            protos: vec![(Collective::AllGather, vec![Proto::Simple])],
            ..NcclPolicy::default()
        };
        assert!(p.allows(Collective::AllReduce, Algo::Ring, Proto::LL));
        assert!(!p.allows(Collective::AllReduce, Algo::Nvls, Proto::Simple));
        assert!(p.allows(Collective::AllGather, Algo::Nvls, Proto::Simple));
        assert!(!p.allows(Collective::AllGather, Algo::Ring, Proto::LL128));
        assert!(NcclPolicy::default().allows(Collective::AllToAll, Algo::Ring, Proto::LL));
        let c = NcclPolicy { min_channels: Some(4), max_channels: Some(8), ..NcclPolicy::default() };
        assert_eq!((c.channels(2), c.channels(6), c.channels(32)), (4, 6, 8));
    }
}
