//! NCCL environment variables as scenario knobs (NCCL_FACTS §7): parsing of `NCCL_ALGO` /
//! `NCCL_PROTO` lists (with `^` negation and `function:` prefixes, as NCCL parses them),
//! channel limits, buffer and chunk sizes, and the NVLS / CollNet / PXN switches.

use super::bench::NcclEnv;
use crate::collective::{Algo, Collective, NcclPolicy};
use crate::schedule::Proto;
use crate::units;

/// The variables fabricsim understands.
pub const KNOWN: &[&str] = &[
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NCHANNELS",
    "NCCL_BUFFSIZE",
    "NCCL_LL_BUFFSIZE",
    "NCCL_LL128_BUFFSIZE",
    "NCCL_NVLS_ENABLE",
    "NCCL_COLLNET_ENABLE",
    "NCCL_NVLS_CHUNKSIZE",
    "NCCL_P2P_NET_CHUNKSIZE",
    "NCCL_P2P_NVL_CHUNKSIZE",
    "NCCL_PXN_DISABLE",
    "NCCL_MIN_CTAS",
    "NCCL_MAX_CTAS",
    "NCCL_NCHANNELS_PER_NET_PEER",
    "NCCL_IB_QPS_PER_CONNECTION",
    "NCCL_IB_SPLIT_DATA_ON_QPS",
    "NCCL_NET_GDR_LEVEL",
    "NCCL_CROSS_NIC",
    "NCCL_IB_ADAPTIVE_ROUTING",
    "NCCL_VERSION",
];

/// Variables accepted and checked, but with no effect in the model, and why (printed as a
/// note where a run sets one).
pub const NO_EFFECT: &[(&str, &str)] = &[(
    "NCCL_CROSS_NIC",
    "the modelled rings and trees stay on their rail (NCCL's choice on rail-optimized fabrics); \
         cross-rail graphs are not searched",
)];

/// The note for a variable that is accepted without effect in the model.
pub fn no_effect_note(key: &str) -> Option<&'static str> {
    NO_EFFECT.iter().find(|(k, _)| *k == key).map(|(_, n)| *n)
}

/// The collectives of a training step for which NCCL_ALGO / NCCL_PROTO are resolved (they
/// may name functions, `allreduce:tree;allgather:ring`). Its all-to-alls and pipeline
/// transfers are NCCL point-to-point operations, which those variables do not govern.
const TRAINING_COLLECTIVES: [Collective; 3] =
    [Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter];

/// The variables that change how a training step's collectives are picked or routed.
const TRAINING_PICK: [&str; 13] = [
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_NVLS_ENABLE",
    "NCCL_COLLNET_ENABLE",
    "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NCHANNELS",
    "NCCL_MIN_CTAS",
    "NCCL_MAX_CTAS",
    "NCCL_IB_ADAPTIVE_ROUTING",
    "NCCL_IB_QPS_PER_CONNECTION",
    "NCCL_IB_SPLIT_DATA_ON_QPS",
    "NCCL_NET_GDR_LEVEL",
    "NCCL_VERSION",
];

/// NCCL's environment for a training step from `(variable, value)` settings, in order: the
/// pick's constraints for each collective the step runs, and a note per variable accepted
/// without effect on a training step (the buffer and chunk knobs: the step's collectives run
/// with NCCL's defaults; and the variables without effect in the model at all). An unknown
/// variable or a bad value is an error, as for a benchmark.
pub fn training_policy(settings: &[(String, String)]) -> Result<(NcclPolicy, Vec<String>), String> {
    let mut policy = NcclPolicy::default();
    let mut notes = Vec::new();
    let mut global = NcclEnv::default();
    for &coll in &TRAINING_COLLECTIVES {
        let mut env = NcclEnv::default();
        for (k, v) in settings {
            env.set(k, v, coll)?;
        }
        policy.algos.push((coll, env.algos.clone()));
        policy.protos.push((coll, env.protos.clone()));
        global = env;
    }
    policy.nvls = global.nvls;
    policy.collnet = global.collnet;
    policy.min_channels = global.min_channels;
    policy.max_channels = global.max_channels;
    policy.net = global.net;
    policy.tuner = global.tuner;
    for (k, _) in settings {
        if let Some(n) = no_effect_note(k) {
            notes.push(format!("{k} is accepted but has no effect in the model: {n}"));
        } else if !TRAINING_PICK.contains(&k.as_str()) {
            notes.push(format!(
                "{k} is accepted but has no effect on a training step: its collectives run with NCCL's \
                 default buffers and chunks (it applies to `bench` and collective scenarios)"
            ));
        }
    }
    Ok((policy, notes))
}

fn integer(key: &str, value: &str, range: std::ops::RangeInclusive<i64>) -> Result<i64, String> {
    match value.trim().parse::<i64>() {
        Ok(v) if range.contains(&v) => Ok(v),
        _ => Err(format!("{key}={value:?}: expected an integer in {}..={}", range.start(), range.end())),
    }
}

fn func_name(c: Collective) -> &'static str {
    match c {
        Collective::AllReduce => "allreduce",
        Collective::AllGather => "allgather",
        Collective::ReduceScatter => "reducescatter",
        Collective::Broadcast => "broadcast",
        Collective::Reduce => "reduce",
        Collective::AllToAll => "alltoall",
        Collective::SendRecv => "sendrecv",
    }
}

/// Parses an NCCL_ALGO/NCCL_PROTO-style list for one collective: `Ring,Tree`, `^NVLS`,
/// `allreduce:tree;allgather:ring`. Returns the enabled items.
fn parse_list<T: Copy + PartialEq>(
    value: &str,
    coll: Collective,
    all: &[T],
    parse: impl Fn(&str) -> Option<T>,
    what: &str,
    valid: &str,
) -> Result<Option<Vec<T>>, String> {
    let mut chosen: Option<Vec<T>> = None;
    for (i, entry) in value.split(';').map(str::trim).filter(|e| !e.is_empty()).enumerate() {
        let (func, list) = match entry.split_once(':') {
            Some((f, l)) => (Some(f.trim().to_ascii_lowercase()), l),
            None if i == 0 => (None, entry),
            None => {
                return Err(format!(
                    "{what} entry {entry:?} needs a `function:` prefix (only the first may omit it)"
                ))
            }
        };
        if let Some(f) = &func {
            let known = Collective::ALL.iter().any(|c| func_name(*c) == f.as_str());
            if !known {
                return Err(format!(
                    "unknown function {f:?} in {what}; valid: broadcast, reduce, allgather, reducescatter, allreduce"
                ));
            }
            if f != func_name(coll) {
                continue;
            }
        }
        let (neg, list) = match list.trim().strip_prefix('^') {
            Some(l) => (true, l),
            None => (false, list),
        };
        let mut items = Vec::new();
        for tok in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            items.push(parse(tok).ok_or_else(|| format!("unknown {what} value {tok:?}; valid: {valid}"))?);
        }
        chosen = Some(if neg { all.iter().copied().filter(|x| !items.contains(x)).collect() } else { items });
    }
    // None: the list does not apply to `coll` (a `function:` list naming others), which
    // keeps NCCL's default (all); Some(empty): a negation that leaves nothing.
    Ok(chosen)
}

fn flag(key: &str, value: &str) -> Result<bool, String> {
    match value.trim() {
        "0" => Ok(false),
        "1" | "2" => Ok(true),
        other => Err(format!("{key}={other:?}: expected 0 or 1 (NVLS also accepts 2, auto)")),
    }
}

fn bytes(key: &str, value: &str) -> Result<u64, String> {
    let b = units::parse_bytes(value).map_err(|e| format!("{key}: {e}"))?;
    if b == 0 {
        return Err(format!("{key} must be positive"));
    }
    Ok(b)
}

fn channels(key: &str, value: &str) -> Result<u32, String> {
    match value.trim().parse::<u32>() {
        Ok(v) if (1..=64).contains(&v) => Ok(v),
        _ => Err(format!("{key}={value:?}: expected a channel count in 1..=64")),
    }
}

impl NcclEnv {
    /// Applies one variable for collective `coll`.
    pub fn set(&mut self, key: &str, value: &str, coll: Collective) -> Result<(), String> {
        match key {
            "NCCL_ALGO" => {
                let list = parse_list(
                    value,
                    coll,
                    &Algo::NCCL,
                    Algo::parse,
                    "NCCL_ALGO",
                    "Ring, Tree, CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT",
                )?;
                if list.as_ref().is_some_and(Vec::is_empty) {
                    return Err(format!("NCCL_ALGO={value:?} leaves no algorithm for {coll}"));
                }
                self.algos = list.unwrap_or_default();
            }
            "NCCL_PROTO" => {
                let list =
                    parse_list(value, coll, &Proto::ALL, Proto::parse, "NCCL_PROTO", "LL, LL128, Simple")?;
                if list.as_ref().is_some_and(Vec::is_empty) {
                    return Err(format!("NCCL_PROTO={value:?} leaves no protocol for {coll}"));
                }
                self.protos = list.unwrap_or_default();
            }
            "NCCL_MIN_NCHANNELS" => self.min_channels = Some(channels(key, value)?),
            "NCCL_MAX_NCHANNELS" => self.max_channels = Some(channels(key, value)?),
            "NCCL_BUFFSIZE" => self.knobs.buffsize = bytes(key, value)?,
            "NCCL_LL_BUFFSIZE" => self.knobs.ll_buffsize = bytes(key, value)?,
            "NCCL_LL128_BUFFSIZE" => self.knobs.ll128_buffsize = bytes(key, value)?,
            "NCCL_NVLS_CHUNKSIZE" => self.knobs.nvls_chunksize = bytes(key, value)?,
            "NCCL_P2P_NET_CHUNKSIZE" => self.knobs.p2p_net_chunksize = bytes(key, value)?,
            "NCCL_P2P_NVL_CHUNKSIZE" => self.knobs.p2p_nvl_chunksize = bytes(key, value)?,
            "NCCL_NVLS_ENABLE" => self.nvls = flag(key, value)?,
            "NCCL_COLLNET_ENABLE" => self.collnet = flag(key, value)?,
            // Not an NCCL variable: the NCCL release whose tuner ranks the candidates.
            "NCCL_VERSION" => {
                self.tuner = crate::collective::tuner::TunerVersion::parse(value).ok_or_else(|| {
                    format!(
                        "NCCL_VERSION={value:?}: fabricsim ranks with NCCL 2.30's tuner (the default) or \
                         NCCL 2.8's (2.8.3, 2.8.4); valid: 2.8, 2.30"
                    )
                })?
            }
            "NCCL_PXN_DISABLE" => self.knobs.pxn_disable = flag(key, value)?,
            // NCCL_MIN_CTAS / NCCL_MAX_CTAS bound the channels (CTAs) of a call like
            // NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS; the most restrictive wins (NCCL_FACTS §7).
            "NCCL_MIN_CTAS" => {
                let v = channels(key, value)?;
                self.min_channels = Some(self.min_channels.map_or(v, |m| m.max(v)));
            }
            "NCCL_MAX_CTAS" => {
                let v = channels(key, value)?;
                self.max_channels = Some(self.max_channels.map_or(v, |m| m.min(v)));
            }
            "NCCL_NCHANNELS_PER_NET_PEER" => {
                self.knobs.net_channels_per_peer = Some(channels(key, value)?);
            }
            "NCCL_IB_QPS_PER_CONNECTION" => {
                self.net.qps_per_connection = integer(key, value, 1..=128)? as u32;
            }
            "NCCL_IB_SPLIT_DATA_ON_QPS" => {
                self.net.split_data_on_qps = integer(key, value, 0..=1)? == 1;
            }
            "NCCL_IB_ADAPTIVE_ROUTING" => {
                self.net.adaptive_routing = integer(key, value, 0..=1)? == 1;
            }
            "NCCL_CROSS_NIC" => {
                integer(key, value, 0..=2)?;
            }
            "NCCL_NET_GDR_LEVEL" => {
                // NCCL's path types by name (NCCL_FACTS 5.3), or NCCL's legacy numbers 0..=5
                // (`ncclGetLevel`: LOC, PIX, PXB, PHB, SYS, SYS).
                use crate::fabric::PathType::*;
                let types = [Loc, Nvl, Nvb, C2c, Pix, Pxb, P2c, Pxn, Phb, Sys];
                let legacy = [Loc, Pix, Pxb, Phb, Sys, Sys];
                let v = value.trim().to_ascii_uppercase();
                let level = match v.parse::<usize>() {
                    Ok(i) => legacy.get(i).copied(),
                    Err(_) => types.into_iter().find(|t| t.name() == v),
                };
                self.net.gdr_level = level.ok_or_else(|| {
                    format!(
                        "NCCL_NET_GDR_LEVEL={value:?}: expected a path type (LOC, NVL, NVB, C2C, PIX, PXB, P2C, PXN, PHB, SYS) or a legacy level 0..=5"
                    )
                })?;
            }
            other => {
                let near = crate::suggest::nearest(other, KNOWN.iter().copied())
                    .map(|n| format!(" (did you mean {n}?)"))
                    .unwrap_or_default();
                return Err(format!(
                    "unknown NCCL variable {other:?}{near}; fabricsim understands: {}",
                    KNOWN.join(", ")
                ));
            }
        }
        if let (Some(a), Some(b)) = (self.min_channels, self.max_channels) {
            if a > b {
                return Err(format!("NCCL_MIN_NCHANNELS={a} is larger than NCCL_MAX_NCHANNELS={b}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algo_lists_like_nccl() {
        let mut e = NcclEnv::default();
        e.set("NCCL_ALGO", "Ring,Tree", Collective::AllReduce).unwrap();
        assert_eq!(e.algos, vec![Algo::Ring, Algo::Tree]);
        e.set("NCCL_ALGO", "^NVLS,NVLSTree", Collective::AllReduce).unwrap();
        assert!(!e.algos.contains(&Algo::Nvls) && e.algos.contains(&Algo::Ring));
        e.set("NCCL_ALGO", "allgather:ring;allreduce:tree", Collective::AllReduce).unwrap();
        assert_eq!(e.algos, vec![Algo::Tree]);
        assert!(e.set("NCCL_ALGO", "Rnig", Collective::AllReduce).unwrap_err().contains("valid"));
        assert!(e.set("NCCL_ALGOS", "Ring", Collective::AllReduce).unwrap_err().contains("NCCL_ALGO"));
        e.set("NCCL_PROTO", "^LL", Collective::AllReduce).unwrap();
        assert_eq!(e.protos, vec![Proto::LL128, Proto::Simple]);
    }

    #[test]
    fn tuning_variables_are_accepted_checked_and_modelled_where_they_matter() {
        let c = Collective::AllReduce;
        let mut e = NcclEnv::default();
        e.set("NCCL_MAX_NCHANNELS", "16", c).unwrap();
        e.set("NCCL_MAX_CTAS", "8", c).unwrap();
        e.set("NCCL_MAX_CTAS", "32", c).unwrap();
        assert_eq!(e.max_channels, Some(8), "the most restrictive maximum wins");
        e.set("NCCL_MIN_CTAS", "4", c).unwrap();
        assert_eq!(e.min_channels, Some(4));
        assert!(e.clone().set("NCCL_MIN_CTAS", "32", c).unwrap_err().contains("larger than"));
        e.set("NCCL_NCHANNELS_PER_NET_PEER", "2", c).unwrap();
        assert_eq!(e.knobs.net_channels_per_peer, Some(2));
        e.set("NCCL_P2P_NET_CHUNKSIZE", "512K", c).unwrap();
        assert_eq!(e.knobs.p2p_net_chunksize, 512 << 10);
        // Every variable without a modelled effect takes "1" and changes nothing.
        for &(k, _) in NO_EFFECT {
            let before = e.clone();
            e.set(k, "1", c).unwrap();
            assert_eq!(e, before, "{k} has no modelled effect");
            assert!(no_effect_note(k).is_some(), "{k} needs its note");
        }
        assert!(no_effect_note("NCCL_MAX_CTAS").is_none());
        // Adaptive routing is on by default (as NCCL's on InfiniBand); 0 turns it off.
        assert!(e.net.adaptive_routing);
        e.set("NCCL_IB_ADAPTIVE_ROUTING", "0", c).unwrap();
        assert!(!e.net.adaptive_routing && no_effect_note("NCCL_IB_ADAPTIVE_ROUTING").is_none());
        assert!(e.set("NCCL_IB_ADAPTIVE_ROUTING", "2", c).unwrap_err().contains("0..=1"));
        // A training step routes its collectives by it too (no note).
        let (policy, notes) = training_policy(&[("NCCL_IB_ADAPTIVE_ROUTING".into(), "0".into())]).unwrap();
        assert!(!policy.net.adaptive_routing && notes.is_empty(), "{notes:?}");
        assert!(training_policy(&[]).unwrap().0.net.adaptive_routing);
        assert!(e.set("NCCL_IB_QPS_PER_CONNECTION", "0", c).unwrap_err().contains("1..=128"));
        // Queue pairs per connection spread it over hashed paths, in bench and training.
        e.set("NCCL_IB_QPS_PER_CONNECTION", "4", c).unwrap();
        assert!(e.net.qps_per_connection == 4 && no_effect_note("NCCL_IB_QPS_PER_CONNECTION").is_none());
        let (policy, notes) = training_policy(&[("NCCL_IB_QPS_PER_CONNECTION".into(), "4".into())]).unwrap();
        assert!(policy.net.qps_per_connection == 4 && notes.is_empty(), "{notes:?}");
        // Split mode: every message over all of them (NCCL's default 0: in turn).
        assert!(!e.net.split_data_on_qps);
        e.set("NCCL_IB_SPLIT_DATA_ON_QPS", "1", c).unwrap();
        assert!(e.net.split_data_on_qps && no_effect_note("NCCL_IB_SPLIT_DATA_ON_QPS").is_none());
        assert!(e.set("NCCL_IB_SPLIT_DATA_ON_QPS", "2", c).unwrap_err().contains("0..=1"));
        assert!(e.set("NCCL_CROSS_NIC", "3", c).unwrap_err().contains("0..=2"));
        assert!(e.set("NCCL_NET_GDR_LEVEL", "FAR", c).unwrap_err().contains("path type"));
        assert!(e.set("NCCL_NET_GDR_LEVEL", "6", c).unwrap_err().contains("0..=5"));
        // The GDR level is a path type by name, or one of NCCL's legacy numbers.
        e.set("NCCL_NET_GDR_LEVEL", "loc", c).unwrap();
        assert_eq!(e.net.gdr_level, crate::fabric::PathType::Loc);
        e.set("NCCL_NET_GDR_LEVEL", "2", c).unwrap();
        assert_eq!(e.net.gdr_level, crate::fabric::PathType::Pxb);
        e.set("NCCL_NET_GDR_LEVEL", "3", c).unwrap();
        assert_eq!(e.net.gdr_level, crate::fabric::PathType::Phb);
        assert!(no_effect_note("NCCL_NET_GDR_LEVEL").is_none());
        assert!(e.set("NCCL_NCHANNELS_PER_NET_PEER", "0", c).unwrap_err().contains("1..=64"));
    }
}
