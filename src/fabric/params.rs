//! Model parameters: how fast the hardware really goes (link efficiencies and latencies,
//! protocol costs, kernel launch, reduction rates, NVLS and SHARP costs). One set per GPU
//! generation lives in `params.toml` next to this file, each number with its source; a
//! topology file's `[params]` table or a calibration profile overrides any of them, and its
//! `[compute]` table any constant of the training compute model (whose shipped values live in
//! `workload/gpu_params.toml`).
//!
//! Architecture invariant: parameters are plain data. Nothing else in the crate hard-codes
//! a latency or an efficiency; the simulator and the analytical model both read them here.

use serde::{Deserialize, Serialize};

use super::spec::Generation;
use super::LinkClass;
use crate::units::{self, Bandwidth, SimTime};

const DEFAULTS: &str = include_str!("params.toml");

/// Per link class: payload efficiency of the line rate and the hop latency.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkParams {
    /// Fraction of the line rate that carries payload (headers, flow control, DMA limits).
    pub efficiency: f64,
    /// Latency of one hop when the topology file does not give one (a duration string).
    pub latency: String,
}

/// Link parameters by physical kind.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinksParams {
    /// NVLink and NVSwitch ports.
    pub nvlink: LinkParams,
    /// PCIe links.
    pub pcie: LinkParams,
    /// CPU-to-CPU links.
    pub inter_socket: LinkParams,
    /// Grace-GPU C2C.
    pub c2c: LinkParams,
    /// Network ports (NIC-switch, switch-switch).
    pub net: LinkParams,
}

/// Latency by NCCL's hardware class.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ByClass {
    /// Over NVLink.
    pub nvlink: String,
    /// Over PCIe / host.
    pub pcie: String,
    /// Over the network.
    pub net: String,
}

/// Costs of one NCCL protocol.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProtoParams {
    /// Payload bytes per wire byte (LL 0.5, LL128 120/128, Simple 1).
    pub payload: f64,
    /// Throughput one channel (one CUDA block) can drive, in GB/s.
    pub channel_gbps: f64,
    /// Synchronisation latency of one step (flag, fence, proxy) by link class.
    pub step_latency: ByClass,
}

/// Protocol parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProtocolsParams {
    /// Low-latency protocol (8-byte flag per 8 bytes).
    pub ll: ProtoParams,
    /// LL128 (8-byte flag per 128-byte line).
    pub ll128: ProtoParams,
    /// Simple (bulk data plus fences).
    pub simple: ProtoParams,
}

/// GPU-side costs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuParams {
    /// Time from the host call until the first collective kernel runs.
    pub launch: String,
    /// Extra delay for each further GPU launched by the same host thread (nccl-tests `-g`).
    pub launch_stagger: String,
    /// Element-wise reduction throughput of one channel, GB/s of output.
    pub reduce_channel_gbps: f64,
}

/// NVLink SHARP (NVSwitch multicast and reduction).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvlsParams {
    /// Efficiency of multimem traffic relative to plain NVLink payload.
    pub efficiency: f64,
    /// Fixed cost of one multimem reduce/multicast step.
    pub step_latency: String,
}

/// InfiniBand SHARP (CollNet).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharpParams {
    /// Efficiency of aggregation traffic relative to the port rate.
    pub efficiency: f64,
    /// Fixed cost of one aggregation operation (per chunk).
    pub step_latency: String,
}

/// All model parameters of one fabric.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelParams {
    /// Links.
    pub link: LinksParams,
    /// Protocols.
    pub protocol: ProtocolsParams,
    /// GPU.
    pub gpu: GpuParams,
    /// NVLS.
    pub nvls: NvlsParams,
    /// SHARP.
    pub sharp: SharpParams,
    /// Overrides of the training compute model's constants (`workload/gpu_params.toml`);
    /// empty in the shipped parameters.
    #[serde(default, skip_serializing_if = "ComputeOverrides::is_empty")]
    pub compute: ComputeOverrides,
}

/// A profile's or topology's `[compute]` table: constants of the training compute model
/// that replace the generation's shipped ones (`workload::compute::GpuParams`, same names).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComputeOverrides {
    /// Fraction of the dense BF16 peak a large BF16 GEMM sustains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm_eff: Option<f64>,
    /// Fraction of the dense FP8 peak a large FP8 GEMM sustains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm_eff_fp8: Option<f64>,
    /// Dimension at which a GEMM loses half its efficiency along that axis.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm_half_dim: Option<f64>,
    /// Fraction of the dense peak a fused attention kernel's inner loop sustains in the
    /// forward.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_eff: Option<f64>,
    /// Time of a fused attention kernel's backward block, in forward blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_bwd: Option<f64>,
    /// Fixed cost of one forward tile of a fused attention kernel, in its key blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_tile_fwd: Option<f64>,
    /// Fixed cost of one backward tile of a fused attention kernel, in its query blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_tile_bwd: Option<f64>,
    /// Fraction of HBM bandwidth memory-bound kernels sustain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hbm_eff: Option<f64>,
    /// Slowdown of compute that runs beside a communication kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap_slowdown: Option<f64>,
    /// Fixed time of one device-to-device copy issued behind another, in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_floor_us: Option<f64>,
}

impl ComputeOverrides {
    /// The keys a `[compute]` table may hold.
    pub const KEYS: [&'static str; 10] = [
        "gemm_eff",
        "gemm_eff_fp8",
        "gemm_half_dim",
        "attention_eff",
        "attention_bwd",
        "attention_tile_fwd",
        "attention_tile_bwd",
        "hbm_eff",
        "overlap_slowdown",
        "copy_floor_us",
    ];

    /// No constant is overridden.
    pub fn is_empty(&self) -> bool {
        *self == ComputeOverrides::default()
    }

    /// The constants set, by name (the names of [`ComputeOverrides::KEYS`]).
    pub fn set(&self) -> impl Iterator<Item = (&'static str, f64)> {
        let v = [
            self.gemm_eff,
            self.gemm_eff_fp8,
            self.gemm_half_dim,
            self.attention_eff,
            self.attention_bwd,
            self.attention_tile_fwd,
            self.attention_tile_bwd,
            self.hbm_eff,
            self.overlap_slowdown,
            self.copy_floor_us,
        ];
        Self::KEYS.into_iter().zip(v).filter_map(|(k, v)| v.map(|v| (k, v)))
    }
}

/// A parameter value that does not parse, or an unknown key.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ParamsError(pub String);

/// The keys of a generation whose shipped values are the output of `calibrate` on the
/// generation's named reference tables (`[fitted]` in `params.toml`), and the significant
/// digits they are written with. Every other key is measured, datasheet or assumed and is held
/// fixed when they are fitted.
#[derive(Clone, Debug, PartialEq)]
pub struct FittedKeys {
    /// Dotted keys (`link.nvlink.efficiency`), in the file's order.
    pub keys: Vec<String>,
    /// Significant digits the fitted values are rounded to.
    pub digits: u32,
}

/// The `[fitted]` list of a generation (empty for a generation with none, such as Volta).
pub fn fitted_keys(generation: Generation) -> FittedKeys {
    let all: toml::Table = match toml::from_str(DEFAULTS) {
        Ok(t) => t,
        Err(e) => unreachable_defaults(&e.to_string()),
    };
    let fitted = all.get("fitted").and_then(|v| v.as_table());
    let digits = fitted.and_then(|t| t.get("digits")).and_then(|v| v.as_integer()).unwrap_or(3);
    let keys = fitted
        .and_then(|t| t.get(generation.key()))
        .and_then(|v| v.as_array())
        .map(|a| a.iter().filter_map(|k| k.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    FittedKeys { keys, digits: digits.clamp(1, 15) as u32 }
}

/// `v` rounded to `digits` significant digits (0 and non-finite values unchanged). The result
/// is the double nearest to a short decimal, so that it prints as that decimal.
pub fn round_significant(v: f64, digits: u32) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    let e = v.abs().log10().floor() as i32;
    let k = digits as i32 - 1 - e;
    if k >= 0 {
        let s = 10f64.powi(k);
        (v * s).round() / s
    } else {
        let s = 10f64.powi(-k);
        (v / s).round() * s
    }
}

/// `text` (a `params.toml`) with the given keys of `[generation]` set to new values, every
/// comment, alignment and other value kept as written (the values' own spacing too). Keys are
/// dotted (`protocol.simple.step_latency.nvlink`); each must already be present, with a value
/// of the same type as the new one.
pub fn rewrite_values(
    text: &str,
    generation: Generation,
    values: &[(String, toml::Value)],
) -> Result<String, ParamsError> {
    let mut doc: toml_edit::DocumentMut =
        text.parse().map_err(|e: toml_edit::TomlError| ParamsError(format!("params.toml: {e}")))?;
    let section = generation.key();
    for (key, new) in values {
        let mut item = doc.as_item_mut();
        for part in std::iter::once(section).chain(key.split('.')) {
            if item.get(part).is_none() {
                return Err(ParamsError(format!("params.toml has no [{section}] {key}")));
            }
            item = &mut item[part];
        }
        let Some(old) = item.as_value_mut() else {
            return Err(ParamsError(format!("params.toml [{section}] {key} is not a value")));
        };
        let mut v: toml_edit::Value = match new {
            toml::Value::Float(f) => (*f).into(),
            toml::Value::Integer(i) => (*i).into(),
            toml::Value::String(s) => s.as_str().into(),
            other => return Err(ParamsError(format!("{key}: cannot write {other} into params.toml"))),
        };
        if v.type_name() != old.type_name() && !(v.is_float() && old.is_integer()) {
            return Err(ParamsError(format!(
                "params.toml [{section}] {key} is a {}, not a {}",
                old.type_name(),
                v.type_name()
            )));
        }
        *v.decor_mut() = old.decor().clone();
        *old = v;
    }
    Ok(doc.to_string())
}

impl ModelParams {
    /// The shipped defaults for a GPU generation.
    pub fn for_generation(generation: Generation) -> ModelParams {
        let all: toml::Table = match toml::from_str(DEFAULTS) {
            Ok(t) => t,
            Err(e) => unreachable_defaults(&e.to_string()),
        };
        let section = all
            .get(generation.key())
            .or_else(|| all.get("hopper"))
            .cloned()
            .unwrap_or(toml::Value::Table(Default::default()));
        match section.try_into::<ModelParams>() {
            Ok(p) => p,
            Err(e) => unreachable_defaults(&e.to_string()),
        }
    }

    /// These parameters with the keys of `table` replaced (a profile or `[params]`).
    pub fn overlay(&self, table: &toml::Table) -> Result<ModelParams, ParamsError> {
        let mut base = toml::Table::try_from(self).map_err(|e| ParamsError(e.to_string()))?;
        super::file::merge_tables(&mut base, table.clone());
        let p: ModelParams = toml::Value::Table(base).try_into().map_err(|e: toml::de::Error| {
            ParamsError(format!(
                "{} (valid sections: link.{{nvlink,pcie,inter_socket,c2c,net}}.{{efficiency,latency}}, \
                 protocol.{{ll,ll128,simple}}.{{payload,channel_gbps,step_latency.{{nvlink,pcie,net}}}}, \
                 gpu.{{launch,launch_stagger,reduce_channel_gbps}}, nvls.{{efficiency,step_latency}}, \
                 sharp.{{efficiency,step_latency}}, compute.{{{}}})",
                e.message(),
                ComputeOverrides::KEYS.join(",")
            ))
        })?;
        p.validate()?;
        Ok(p)
    }

    /// Checks every value: efficiencies in (0, 1], durations parse, rates positive.
    pub fn validate(&self) -> Result<(), ParamsError> {
        let eff = |name: &str, v: f64| {
            if v > 0.0 && v <= 1.0 {
                Ok(())
            } else {
                Err(ParamsError(format!("{name} = {v} must be in (0, 1]")))
            }
        };
        let dur = |name: &str, v: &str| {
            units::parse_time(v).map(|_| ()).map_err(|e| ParamsError(format!("{name}: {e}")))
        };
        let pos = |name: &str, v: f64| {
            if v > 0.0 && v.is_finite() {
                Ok(())
            } else {
                Err(ParamsError(format!("{name} = {v} must be positive")))
            }
        };
        for (n, l) in [
            ("link.nvlink", &self.link.nvlink),
            ("link.pcie", &self.link.pcie),
            ("link.inter_socket", &self.link.inter_socket),
            ("link.c2c", &self.link.c2c),
            ("link.net", &self.link.net),
        ] {
            eff(&format!("{n}.efficiency"), l.efficiency)?;
            dur(&format!("{n}.latency"), &l.latency)?;
        }
        for (n, p) in [
            ("protocol.ll", &self.protocol.ll),
            ("protocol.ll128", &self.protocol.ll128),
            ("protocol.simple", &self.protocol.simple),
        ] {
            eff(&format!("{n}.payload"), p.payload)?;
            pos(&format!("{n}.channel_gbps"), p.channel_gbps)?;
            dur(&format!("{n}.step_latency.nvlink"), &p.step_latency.nvlink)?;
            dur(&format!("{n}.step_latency.pcie"), &p.step_latency.pcie)?;
            dur(&format!("{n}.step_latency.net"), &p.step_latency.net)?;
        }
        dur("gpu.launch", &self.gpu.launch)?;
        dur("gpu.launch_stagger", &self.gpu.launch_stagger)?;
        pos("gpu.reduce_channel_gbps", self.gpu.reduce_channel_gbps)?;
        eff("nvls.efficiency", self.nvls.efficiency)?;
        dur("nvls.step_latency", &self.nvls.step_latency)?;
        eff("sharp.efficiency", self.sharp.efficiency)?;
        dur("sharp.step_latency", &self.sharp.step_latency)?;
        for (k, v) in self.compute.set() {
            let name = format!("compute.{k}");
            let bad = |why: &str| Err(ParamsError(format!("{name} = {v} must be {why}")));
            match k {
                "gemm_half_dim" | "attention_tile_fwd" | "attention_tile_bwd" | "copy_floor_us" => {
                    if !(v >= 0.0 && v.is_finite()) {
                        return bad("0 or more");
                    }
                }
                "overlap_slowdown" => {
                    if !(0.0..1.0).contains(&v) {
                        return bad("in [0, 1)");
                    }
                }
                "attention_bwd" => {
                    if !(v > 0.0 && v.is_finite()) {
                        return bad("positive (forward blocks a backward block takes)");
                    }
                }
                _ => eff(&name, v)?,
            }
        }
        Ok(())
    }

    /// Resolved numbers for the hot path.
    pub fn resolve(&self) -> Resolved {
        let t = |s: &str| units::parse_time(s).unwrap_or(SimTime::ZERO);
        let proto = |p: &ProtoParams| ResolvedProto {
            payload: p.payload,
            channel_bw: Bandwidth::from_gbytes(p.channel_gbps),
            step_latency: [t(&p.step_latency.nvlink), t(&p.step_latency.pcie), t(&p.step_latency.net)],
        };
        Resolved {
            link_eff: [
                self.link.nvlink.efficiency,
                self.link.pcie.efficiency,
                self.link.inter_socket.efficiency,
                self.link.c2c.efficiency,
                self.link.net.efficiency,
            ],
            link_latency: [
                t(&self.link.nvlink.latency),
                t(&self.link.pcie.latency),
                t(&self.link.inter_socket.latency),
                t(&self.link.c2c.latency),
                t(&self.link.net.latency),
            ],
            proto: [proto(&self.protocol.ll), proto(&self.protocol.ll128), proto(&self.protocol.simple)],
            launch: t(&self.gpu.launch),
            launch_stagger: t(&self.gpu.launch_stagger),
            reduce_channel_bw: Bandwidth::from_gbytes(self.gpu.reduce_channel_gbps),
            nvls_eff: self.nvls.efficiency,
            nvls_step: t(&self.nvls.step_latency),
            sharp_eff: self.sharp.efficiency,
            sharp_step: t(&self.sharp.step_latency),
        }
    }
}

#[cold]
fn unreachable_defaults(msg: &str) -> ! {
    // The defaults are compiled in and covered by a unit test; reaching this is a build bug.
    panic!("fabric/params.toml is invalid: {msg}")
}

/// Resolved protocol costs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ResolvedProto {
    /// Payload fraction of wire bytes.
    pub payload: f64,
    /// Per-channel throughput.
    pub channel_bw: Bandwidth,
    /// Step latency by [`LinkClass`] (NVLink, PCIe, Net).
    pub step_latency: [SimTime; 3],
}

impl ResolvedProto {
    /// Step latency over a link class.
    pub fn step(&self, class: LinkClass) -> SimTime {
        self.step_latency[class as usize]
    }
}

/// Parameters with durations parsed, indexed for the hot path.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved {
    /// Efficiency by link kind index (nvlink, pcie, inter_socket, c2c, net).
    pub link_eff: [f64; 5],
    /// Default latency by link kind index.
    pub link_latency: [SimTime; 5],
    /// Protocols (LL, LL128, Simple).
    pub proto: [ResolvedProto; 3],
    /// Kernel launch.
    pub launch: SimTime,
    /// Launch stagger per extra GPU of one thread.
    pub launch_stagger: SimTime,
    /// Per-channel reduction rate.
    pub reduce_channel_bw: Bandwidth,
    /// NVLS efficiency.
    pub nvls_eff: f64,
    /// NVLS step latency.
    pub nvls_step: SimTime,
    /// SHARP efficiency.
    pub sharp_eff: f64,
    /// SHARP step latency.
    pub sharp_step: SimTime,
}

/// Index of a link kind in [`Resolved::link_eff`].
pub fn kind_index(kind: super::LinkKind) -> usize {
    match kind {
        super::LinkKind::NvLink { .. } => 0,
        super::LinkKind::Pcie { .. } => 1,
        super::LinkKind::InterSocket => 2,
        super::LinkKind::C2c => 3,
        super::LinkKind::Net => 4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_generation_has_valid_defaults() {
        for g in [Generation::Volta, Generation::Ampere, Generation::Hopper, Generation::Blackwell] {
            let p = ModelParams::for_generation(g);
            p.validate().unwrap();
        }
    }

    #[test]
    fn rounding_keeps_significant_digits() {
        assert_eq!(round_significant(0.78372, 3), 0.784);
        assert_eq!(round_significant(69.22, 3), 69.2);
        assert_eq!(round_significant(1234.6, 3), 1230.0);
        assert_eq!(round_significant(0.0066261, 3), 0.00663);
        assert_eq!(round_significant(0.0, 3), 0.0);
        assert_eq!(format!("{}", round_significant(9.5441, 3)), "9.54");
    }

    #[test]
    fn rewriting_keeps_comments_and_layout() {
        let text = "# head\n[fitted]\nhopper = [\"gpu.launch\"]\n\n[hopper]\n\
                    link.nvlink = { efficiency = 0.82, latency = \"0.25us\" }   # nv\n\
                    gpu  = { launch = \"5.0us\", launch_stagger = \"3.0us\", reduce_channel_gbps = 80.0 }\n\
                    [ampere]\ngpu  = { launch = \"3.0us\" }\n";
        let out = rewrite_values(
            text,
            Generation::Hopper,
            &[
                ("link.nvlink.efficiency".into(), toml::Value::Float(0.784)),
                ("gpu.launch".into(), toml::Value::String("9.54us".into())),
            ],
        )
        .unwrap();
        assert_eq!(
            out,
            text.replace("efficiency = 0.82,", "efficiency = 0.784,").replace("\"5.0us\"", "\"9.54us\"")
        );
        let e = rewrite_values(text, Generation::Hopper, &[("gpu.lunch".into(), toml::Value::Float(1.0))]);
        assert!(e.unwrap_err().0.contains("no [hopper] gpu.lunch"));
        let e = rewrite_values(text, Generation::Hopper, &[("gpu.launch".into(), toml::Value::Float(1.0))]);
        assert!(e.unwrap_err().0.contains("is a string, not a float"));
    }

    #[test]
    fn fitted_keys_are_fittable_values() {
        for g in [Generation::Ampere, Generation::Hopper, Generation::Blackwell] {
            let f = fitted_keys(g);
            assert!(!f.keys.is_empty(), "{g:?}");
            let table = toml::Table::try_from(ModelParams::for_generation(g)).unwrap();
            for k in &f.keys {
                let mut cur = &table;
                let parts: Vec<&str> = k.split('.').collect();
                for p in &parts[..parts.len() - 1] {
                    cur = cur.get(*p).and_then(|v| v.as_table()).unwrap_or_else(|| panic!("{k}"));
                }
                assert!(cur.contains_key(parts[parts.len() - 1]), "{g:?}: {k}");
            }
        }
        assert!(fitted_keys(Generation::Volta).keys.is_empty());
    }

    #[test]
    fn overlay_replaces_and_rejects_unknown() {
        let p = ModelParams::for_generation(Generation::Hopper);
        let t: toml::Table = toml::from_str("[link.nvlink]\nefficiency = 0.5").unwrap();
        assert_eq!(p.overlay(&t).unwrap().link.nvlink.efficiency, 0.5);
        let bad: toml::Table = toml::from_str("[link.nvlnk]\nefficiency = 0.5").unwrap();
        assert!(p.overlay(&bad).unwrap_err().0.contains("nvlnk"));
        let bad: toml::Table = toml::from_str("[link.nvlink]\nefficiency = 1.5").unwrap();
        assert!(p.overlay(&bad).is_err());
    }
}
