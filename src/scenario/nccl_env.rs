//! NCCL environment variables as scenario knobs (NCCL_FACTS §7): parsing of `NCCL_ALGO` /
//! `NCCL_PROTO` lists (with `^` negation and `function:` prefixes, as NCCL parses them),
//! channel limits, buffer and chunk sizes, and the NVLS / CollNet / PXN switches.

use super::bench::NcclEnv;
use crate::collective::{Algo, Collective};
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
];

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
) -> Result<Vec<T>, String> {
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
    Ok(chosen.unwrap_or_default())
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
                self.algos = parse_list(
                    value,
                    coll,
                    &Algo::NCCL,
                    Algo::parse,
                    "NCCL_ALGO",
                    "Ring, Tree, CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT",
                )?
            }
            "NCCL_PROTO" => {
                self.protos =
                    parse_list(value, coll, &Proto::ALL, Proto::parse, "NCCL_PROTO", "LL, LL128, Simple")?
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
            "NCCL_PXN_DISABLE" => self.knobs.pxn_disable = flag(key, value)?,
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
        if key == "NCCL_ALGO" && self.algos.is_empty() {
            return Err(format!("NCCL_ALGO={value:?} leaves no algorithm for {coll}"));
        }
        if key == "NCCL_PROTO" && self.protos.is_empty() {
            return Err(format!("NCCL_PROTO={value:?} leaves no protocol for {coll}"));
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
}
