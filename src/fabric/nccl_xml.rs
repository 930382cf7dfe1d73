//! Import of the XML topology that NCCL writes with `NCCL_TOPO_DUMP_FILE` (format in the
//! project's NCCL_FACTS §5.9): `system` > `cpu` > nested `pci` holding `gpu` (with `nvlink`
//! and `c2c` children), `nic` (with `net` ports) and `pcilink`. The result is the same
//! validated [`TopologySpec`] the TOML loader produces, so `fabricsim topo dump.xml` works
//! like a topology file.
//!
//! How elements become devices and links:
//!
//! - `cpu` → a CPU socket; vendor from `vendor` (GenuineIntel → intel, AuthenticAMD → amd)
//!   or `arch` (arm64/aarch64 → arm; anything else → intel). All CPUs of the file are joined
//!   pairwise by inter-socket links at NCCL's own model figures (NCCL_FACTS §5.2: Intel
//!   Sapphire Rapids 22, Emerald Rapids 40, Skylake 10, older 6 GB/s by `modelid`; AMD 16;
//!   Arm 6), because the dump holds nothing better.
//! - `pci` holding a `gpu` → the GPU; holding a `nic` → one NIC device per `net` port, with
//!   the rate from `speed` (Mb/s; ≤ 0 means 10 Gb/s, as NCCL); class 0x068000 → an NVSwitch
//!   (only a link target); any other `pci` → a PCIe switch. Every `pci` element is linked
//!   to its parent. The generation and width come from `link_speed` and `link_width` read
//!   the way NCCL reads them (2.5/5/8/16/32/64 GT/s; unknown → 8 GT/s; width 0 → 16), but
//!   the bandwidth is the line rate (Gen5 x16 = 63 GB/s), as in the TOML topologies: NCCL's
//!   own ~75% derating (`width × speed / 80`) is the job of the model parameters here.
//!   A `nic` directly under a `cpu` (no PCIe attributes) is linked at PCIe Gen5 x16.
//! - `nvlink` to an NVSwitch (`tclass` 0x068000, or a busid that is an NVSwitch `pci`) →
//!   one `nvswitch` device for all targets (as NCCL: one NVS node), linked to each GPU with
//!   lanes = the sum of its counts; chips = distinct NVSwitch busids; NVLS on for sm90 and
//!   later (the dump does not say; NCCL asks the driver). `nvlink` to another GPU → a direct
//!   GPU-GPU link. The NVLink generation follows the GPU (sm70 2, sm8x 3, sm90 4, sm100 5).
//! - `c2c` → a C2C link from the GPU to its CPU at `bw × count / 1000` GB/s (NCCL's rule).
//! - `pcilink` → a PCIe link between two switches, at the width and speed of its element.
//!
//! The GPU model comes from `sm`, which only names a generation: sm80 → A100 SXM4 80GB,
//! sm89 → L40S, sm90 → H100 SXM5 (an H200 dumps the same sm), sm100 → B200, or GB200 when
//! the GPUs have C2C links. Figures and their sources are those of the shipped topology
//! files. GPUs are ranked by `dev`; NICs take rails in `net` `dev` order.
//!
//! **Network.** A dump describes one node and no network. So that `--nodes N` works, a node
//! with NICs gets a default rail-optimized `[cluster.network]` derived from the fastest NIC:
//! 800G → Quantum-X800 (radix 144, SHARP gen 4), 400G → Quantum-2 QM9700 (radix 64, SHARP
//! gen 3), 200G → Quantum QM8700 (radix 40, SHARP gen 2), slower → a generic radix-64 switch
//! without SHARP; scalable units of radix/2 nodes, non-blocking.
//!
//! Errors name the file and, where an element is to blame, its line and column: malformed
//! XML, a root that is not `<system>`, an unknown `sm` (listing the known ones), GPUs of
//! different models, an `nvlink` target that does not exist, and a GPU with no route to
//! the others (for example a `<pci>` placed outside any `<cpu>`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use quick_xml::events::Event;
use quick_xml::Reader;
use serde::Deserialize;

use super::file::{line_col, Source};
use super::spec::*;
use super::{CpuVendor, DeviceKind, LinkKind, SharpSpec, TopologyError};
use crate::units::{Bandwidth, SimTime};

// ---------------------------------------------------------------- serde tree

#[derive(Deserialize, Debug)]
struct SystemXml {
    #[serde(rename = "$value", default)]
    children: Vec<SystemChild>,
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "lowercase")]
enum SystemChild {
    Cpu(CpuXml),
    Pci(PciXml),
    #[serde(other)]
    Unknown,
}

#[derive(Deserialize, Debug)]
struct CpuXml {
    #[serde(rename = "@numaid")]
    numaid: Option<String>,
    #[serde(rename = "@arch")]
    arch: Option<String>,
    #[serde(rename = "@vendor")]
    vendor: Option<String>,
    #[serde(rename = "@familyid")]
    familyid: Option<String>,
    #[serde(rename = "@modelid")]
    modelid: Option<String>,
    #[serde(rename = "$value", default)]
    children: Vec<CpuChild>,
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "lowercase")]
enum CpuChild {
    Pci(PciXml),
    Nic(NicXml),
    #[serde(other)]
    Unknown,
}

#[derive(Deserialize, Debug)]
struct PciXml {
    #[serde(rename = "@busid")]
    busid: Option<String>,
    #[serde(rename = "@class")]
    class: Option<String>,
    #[serde(rename = "@link_speed")]
    link_speed: Option<String>,
    #[serde(rename = "@link_width")]
    link_width: Option<String>,
    #[serde(rename = "$value", default)]
    children: Vec<PciChild>,
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "lowercase")]
enum PciChild {
    Pci(PciXml),
    Gpu(GpuXml),
    Nic(NicXml),
    Pcilink(PciLinkXml),
    #[serde(other)]
    Unknown,
}

#[derive(Deserialize, Debug)]
struct GpuXml {
    #[serde(rename = "@dev")]
    dev: Option<String>,
    #[serde(rename = "@sm")]
    sm: Option<String>,
    #[serde(rename = "$value", default)]
    children: Vec<GpuChild>,
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "lowercase")]
enum GpuChild {
    Nvlink(NvLinkXml),
    C2c(C2cXml),
    #[serde(other)]
    Unknown,
}

#[derive(Deserialize, Debug)]
struct NvLinkXml {
    #[serde(rename = "@target")]
    target: Option<String>,
    #[serde(rename = "@count")]
    count: Option<String>,
    #[serde(rename = "@tclass")]
    tclass: Option<String>,
}

#[derive(Deserialize, Debug)]
struct C2cXml {
    #[serde(rename = "@bw")]
    bw: Option<String>,
    #[serde(rename = "@count")]
    count: Option<String>,
}

#[derive(Deserialize, Debug)]
struct NicXml {
    #[serde(rename = "$value", default)]
    children: Vec<NicChild>,
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "lowercase")]
enum NicChild {
    Net(NetXml),
    #[serde(other)]
    Unknown,
}

#[derive(Deserialize, Debug)]
struct NetXml {
    #[serde(rename = "@name")]
    name: Option<String>,
    #[serde(rename = "@dev")]
    dev: Option<String>,
    #[serde(rename = "@speed")]
    speed: Option<String>,
    #[serde(rename = "@gdr")]
    gdr: Option<String>,
}

#[derive(Deserialize, Debug)]
struct PciLinkXml {
    #[serde(rename = "@target")]
    target: Option<String>,
}

// ---------------------------------------------------------------- positions

/// Whether `child` is an element the serde tree reads under `parent` (None: the root).
fn allowed(parent: Option<&str>, child: &str) -> bool {
    match parent {
        None => child == "system",
        Some("system") => matches!(child, "cpu" | "pci"),
        Some("cpu") => matches!(child, "pci" | "nic"),
        Some("pci") => matches!(child, "pci" | "gpu" | "nic" | "pcilink"),
        Some("gpu") => matches!(child, "nvlink" | "c2c"),
        Some("nic") => child == "net",
        _ => false,
    }
}

/// Byte offsets of the elements the serde tree reads, by name, in document order. Reading
/// the tree in document order and taking the next offset of an element's name gives the
/// element's place in the file.
#[derive(Default)]
struct Positions {
    by_name: BTreeMap<String, Vec<usize>>,
    next: BTreeMap<String, usize>,
}

impl Positions {
    fn take(&mut self, name: &str) -> Option<usize> {
        let i = self.next.entry(name.to_string()).or_insert(0);
        let p = self.by_name.get(name).and_then(|v| v.get(*i)).copied();
        *i += 1;
        p
    }
}

/// Checks that the text is well-formed XML with a `<system>` root and records positions.
fn scan(src: &Source) -> Result<Positions, TopologyError> {
    let text = &src.text;
    let mut reader = Reader::from_str(text);
    reader.config_mut().check_end_names = true;
    let mut pos = Positions::default();
    // (name, offset, read by the serde tree)
    let mut stack: Vec<(String, usize, bool)> = Vec::new();
    let mut root_seen = false;
    loop {
        let before = reader.buffer_position() as usize;
        let ev = reader.read_event().map_err(|e| {
            let at = reader.error_position() as usize;
            at_offset(src, at, format!("malformed XML: {e}"))
        })?;
        let (name, empty) = match &ev {
            Event::Start(e) => (e.name().into_inner().to_string(), false),
            Event::Empty(e) => (e.name().into_inner().to_string(), true),
            Event::End(_) => {
                stack.pop();
                continue;
            }
            Event::Eof => break,
            _ => continue,
        };
        // The event may start after leading whitespace that the reader consumed with it.
        let offset = skip_ws(text, before);
        if stack.is_empty() {
            if root_seen {
                return Err(at_offset(
                    src,
                    offset,
                    format!("a second root element <{name}>: an NCCL topology has one <system> root"),
                ));
            }
            root_seen = true;
            if name != "system" {
                return Err(at_offset(
                    src,
                    offset,
                    format!(
                        "the root element is <{name}>, expected <system version=\"1\"> as written by \
                         NCCL_TOPO_DUMP_FILE"
                    ),
                ));
            }
        }
        let parent_read = stack.last().map(|(n, _, r)| (n.as_str(), *r));
        let read = match parent_read {
            None => allowed(None, &name),
            Some((p, true)) => allowed(Some(p), &name),
            Some((_, false)) => false,
        };
        if read {
            pos.by_name.entry(name.clone()).or_default().push(offset);
        }
        if !empty {
            stack.push((name, offset, read));
        }
    }
    if let Some((name, offset, _)) = stack.last() {
        return Err(at_offset(
            src,
            *offset,
            format!("malformed XML: <{name}> is never closed (the file ends first)"),
        ));
    }
    if !root_seen {
        return Err(src.invalid(
            "no XML element found; expected an NCCL topology dump: <system version=\"1\"> with <cpu>, \
             <pci>, <gpu>, <nic> elements",
        ));
    }
    Ok(pos)
}

fn skip_ws(text: &str, mut at: usize) -> usize {
    let b = text.as_bytes();
    while at < b.len() && b[at].is_ascii_whitespace() {
        at += 1;
    }
    at
}

fn at_offset(src: &Source, offset: usize, msg: impl Into<String>) -> TopologyError {
    let mut o = offset.min(src.text.len());
    while !src.text.is_char_boundary(o) {
        o -= 1;
    }
    let (line, col) = line_col(&src.text, o);
    TopologyError::At { file: src.path.display().to_string(), line, col, msg: msg.into() }
}

// ---------------------------------------------------------------- GPU models

struct GpuModel {
    model: &'static str,
    sm_count: u32,
    hbm_gb: f64,
    hbm_tbps: f64,
    /// fp64, fp32, tf32, bf16, fp16, fp8, fp4 in TFLOP/s (dense).
    flops: [f64; 7],
}

/// GPU models by compute capability. Figures as in the shipped topology files:
/// A100 \[S1\]\[S2\], L40S (NVIDIA L40S datasheet), H100 \[S3\]\[S4\],
/// B200 \[S6\]\[S7\], GB200 \[S8\] (HARDWARE_FACTS tags).
fn gpu_model(sm: u32, c2c: bool) -> Option<GpuModel> {
    Some(match sm {
        80 => GpuModel {
            model: "A100-SXM4-80GB",
            sm_count: 108,
            hbm_gb: 80.0,
            hbm_tbps: 2.039,
            flops: [19.5, 19.5, 156.0, 312.0, 312.0, 0.0, 0.0],
        },
        89 => GpuModel {
            model: "L40S-48GB",
            sm_count: 142,
            hbm_gb: 48.0,
            hbm_tbps: 0.864,
            flops: [0.0, 91.6, 183.0, 362.05, 362.05, 733.0, 0.0],
        },
        90 => GpuModel {
            model: "H100-SXM5-80GB",
            sm_count: 132,
            hbm_gb: 80.0,
            hbm_tbps: 3.35,
            flops: [67.0, 67.0, 494.5, 989.5, 989.5, 1979.0, 0.0],
        },
        100 if c2c => GpuModel {
            model: "GB200-186GB",
            sm_count: 152,
            hbm_gb: 186.0,
            hbm_tbps: 8.0,
            flops: [40.0, 80.0, 1250.0, 2500.0, 2500.0, 5000.0, 10000.0],
        },
        100 => GpuModel {
            model: "B200-180GB",
            sm_count: 148,
            hbm_gb: 180.0,
            hbm_tbps: 7.7,
            flops: [37.0, 75.0, 1100.0, 2250.0, 2250.0, 4500.0, 9000.0],
        },
        _ => return None,
    })
}

const KNOWN_SM: &str = "80 (A100), 89 (L40S), 90 (H100/H200), 100 (B200/GB200)";

fn nvlink_gen(sm: u32) -> u8 {
    match sm {
        0..=79 => 2,
        80..=89 => 3,
        90..=99 => 4,
        _ => 5,
    }
}

// ---------------------------------------------------------------- conversion

/// PCIe generation and width of a `pci` element, read as NCCL reads them.
fn pcie_kind(speed: Option<&str>, width: Option<&str>) -> LinkKind {
    let gts: f64 =
        speed.and_then(|s| s.split_whitespace().next()).and_then(|s| s.parse().ok()).unwrap_or(8.0);
    let gen = match gts {
        g if g < 4.0 => 1,
        g if g < 6.0 => 2,
        g if g < 12.0 => 3,
        g if g < 24.0 => 4,
        g if g < 48.0 => 5,
        _ => 6,
    };
    let width =
        width.and_then(|w| w.trim().parse::<u8>().ok()).filter(|w| (1..=32).contains(w)).unwrap_or(16);
    LinkKind::Pcie { gen, width }
}

/// Line rate per direction of a PCIe link (Gen1/2 use 8b/10b, Gen3+ 128b/130b) \[S46\].
fn pcie_bw(kind: LinkKind) -> Bandwidth {
    match kind {
        LinkKind::Pcie { gen, width } => {
            let lane = match gen {
                1 => 0.25,
                2 => 0.5,
                3 => 15.75 / 16.0,
                4 => 31.5 / 16.0,
                5 => 63.0 / 16.0,
                _ => 126.0 / 16.0,
            };
            Bandwidth::from_gbytes(lane * width as f64)
        }
        _ => Bandwidth(0),
    }
}

fn parse_int(s: &str) -> Option<i64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => i64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

fn norm_busid(s: &str) -> String {
    s.trim().to_ascii_lowercase()
}

struct Builder<'a> {
    src: &'a Source,
    pos: Positions,
    devices: Vec<DeviceTemplate>,
    links: Vec<LinkTemplate>,
    /// (dev attribute, local index, offset, busid)
    gpus: Vec<(i64, u32, usize, String)>,
    /// (net dev attribute, local index)
    nics: Vec<(i64, u32)>,
    cpus: Vec<(u32, CpuVendor, Option<i64>)>,
    busid_dev: BTreeMap<String, u32>,
    nvswitch_busids: BTreeSet<String>,
    /// (gpu local index, offset, target, count, tclass)
    nvlinks: Vec<(u32, usize, String, u32, Option<i64>)>,
    /// (gpu local index, cpu local index or None, bandwidth)
    c2c: Vec<(u32, Option<u32>, Bandwidth)>,
    /// (pci local index, offset, target, kind)
    pcilinks: Vec<(u32, usize, String, LinkKind)>,
    sm: Option<(u32, usize)>,
    pcisw: u32,
}

impl Builder<'_> {
    fn device(&mut self, name: String, kind: DeviceKind, model: Option<String>) -> u32 {
        self.devices.push(DeviceTemplate { name, kind, model });
        self.devices.len() as u32 - 1
    }

    fn link(&mut self, a: u32, b: u32, kind: LinkKind, bw: Bandwidth, lanes: u32) {
        self.links.push(LinkTemplate { a, b, kind, bw, latency: None, lanes });
    }

    fn cpu(&mut self, c: &CpuXml, index: usize) -> Result<(), TopologyError> {
        let off = self.pos.take("cpu").unwrap_or(0);
        let arch = c.arch.as_deref().unwrap_or("").to_ascii_lowercase();
        let vendor_s = c.vendor.as_deref().unwrap_or("").trim().to_string();
        let vendor = if vendor_s == "AuthenticAMD" {
            CpuVendor::Amd
        } else if arch.starts_with("arm") || arch.starts_with("aarch64") {
            CpuVendor::Arm
        } else {
            CpuVendor::Intel
        };
        let numa = c.numaid.as_deref().and_then(parse_int).filter(|n| *n >= 0).unwrap_or(index as i64);
        let name = format!("cpu{numa}");
        if self.devices.iter().any(|d| d.name == name) {
            return Err(at_offset(self.src, off, format!("two <cpu> elements with numaid {numa}")));
        }
        let model_id = c.modelid.as_deref().and_then(parse_int);
        let family = c.familyid.as_deref().and_then(parse_int);
        let id = self.device(name, DeviceKind::Cpu { vendor }, (!vendor_s.is_empty()).then_some(vendor_s));
        self.cpus.push((id, vendor, if family == Some(6) { model_id } else { None }));
        for ch in &c.children {
            match ch {
                CpuChild::Pci(p) => self.pci(p, Some(id), Some(id))?,
                CpuChild::Nic(n) => {
                    let kind = LinkKind::Pcie { gen: 5, width: 16 };
                    self.nic(n, id, kind)?;
                }
                CpuChild::Unknown => {}
            }
        }
        Ok(())
    }

    fn nic(&mut self, n: &NicXml, parent: u32, kind: LinkKind) -> Result<(), TopologyError> {
        self.pos.take("nic");
        for ch in &n.children {
            let NicChild::Net(net) = ch else { continue };
            let off = self.pos.take("net").unwrap_or(0);
            let dev = net.dev.as_deref().and_then(parse_int).unwrap_or(self.nics.len() as i64);
            let speed = net.speed.as_deref().and_then(parse_int).filter(|s| *s > 0).unwrap_or(10_000);
            if speed > 100_000_000 {
                return Err(at_offset(
                    self.src,
                    off,
                    format!(
                        "<net> speed=\"{speed}\" Mb/s is beyond any NIC; valid: up to 100000000 (100 Tb/s)"
                    ),
                ));
            }
            let name = format!("nic{dev}");
            if self.devices.iter().any(|d| d.name == name) {
                return Err(at_offset(self.src, off, format!("two <net> ports with dev=\"{dev}\"")));
            }
            let gdr = net.gdr.as_deref().and_then(parse_int).map(|g| g != 0).unwrap_or(true);
            let rate = Bandwidth::from_gbits(speed as f64 / 1000.0);
            let id = self.device(
                name,
                DeviceKind::Nic { rate, gdr, rail: 0 },
                net.name.as_ref().map(|n| n.trim().to_string()),
            );
            self.link(id, parent, kind, pcie_bw(kind), pcie_lanes(kind));
            self.nics.push((dev, id));
        }
        Ok(())
    }

    fn pci(&mut self, p: &PciXml, parent: Option<u32>, cpu: Option<u32>) -> Result<(), TopologyError> {
        let off = self.pos.take("pci").unwrap_or(0);
        let kind = pcie_kind(p.link_speed.as_deref(), p.link_width.as_deref());
        let busid = p.busid.as_deref().map(norm_busid).unwrap_or_default();
        let class = p.class.as_deref().and_then(parse_int).unwrap_or(0);
        let has_gpu = p.children.iter().any(|c| matches!(c, PciChild::Gpu(_)));
        let has_nic = p.children.iter().any(|c| matches!(c, PciChild::Nic(_)));
        // What this element is decides what its children hang off: a PCIe switch holds
        // them; a GPU, a NIC or an NVSwitch element passes them on to its own parent.
        let switch = if has_gpu || has_nic {
            None
        } else if class == 0x068000 {
            self.nvswitch_busids.insert(busid.clone());
            None
        } else {
            let name = format!("pcisw{}", self.pcisw);
            self.pcisw += 1;
            let id = self.device(name, DeviceKind::PcieSwitch, None);
            if !busid.is_empty() {
                self.busid_dev.insert(busid.clone(), id);
            }
            if let Some(par) = parent {
                self.link(id, par, kind, pcie_bw(kind), pcie_lanes(kind));
            }
            Some(id)
        };
        let attach = switch.or(parent);
        let mut gpu_seen = false;
        // Children in document order, so that element positions stay in step.
        for c in &p.children {
            match c {
                PciChild::Pci(q) => self.pci(q, attach, cpu)?,
                PciChild::Gpu(_) if gpu_seen => {
                    let goff = self.pos.take("gpu").unwrap_or(off);
                    return Err(at_offset(
                        self.src,
                        goff,
                        "a second <gpu> in one <pci> element: each GPU has its own <pci busid=..>",
                    ));
                }
                PciChild::Gpu(g) => {
                    gpu_seen = true;
                    self.gpu(g, &busid, off, kind, parent, cpu)?;
                }
                PciChild::Nic(n) => match parent {
                    Some(par) => self.nic(n, par, kind)?,
                    None => {
                        return Err(at_offset(
                            self.src,
                            off,
                            "a NIC <pci> outside any <cpu>: put it under the <cpu> (NUMA node) it \
                             hangs off",
                        ))
                    }
                },
                PciChild::Pcilink(l) => {
                    let loff = self.pos.take("pcilink").unwrap_or(off);
                    if let Some(id) = switch {
                        let target = l.target.as_deref().map(norm_busid).unwrap_or_default();
                        self.pcilinks.push((id, loff, target, kind));
                    }
                }
                PciChild::Unknown => {}
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn gpu(
        &mut self,
        g: &GpuXml,
        busid: &str,
        pci_off: usize,
        kind: LinkKind,
        parent: Option<u32>,
        cpu: Option<u32>,
    ) -> Result<(), TopologyError> {
        let off = self.pos.take("gpu").unwrap_or(pci_off);
        let sm_s = g.sm.as_deref().unwrap_or("");
        let sm = parse_int(sm_s).filter(|s| (1..1000).contains(s)).ok_or_else(|| {
            at_offset(
                self.src,
                off,
                format!("<gpu> has sm=\"{sm_s}\", not a compute capability; known: {KNOWN_SM}"),
            )
        })? as u32;
        if gpu_model(sm, false).is_none() {
            return Err(at_offset(
                self.src,
                off,
                format!("unknown GPU sm={sm}: fabricsim knows sm {KNOWN_SM}"),
            ));
        }
        match self.sm {
            None => self.sm = Some((sm, off)),
            Some((first, first_off)) if first != sm => {
                let (l, c) = line_col(&self.src.text, first_off);
                return Err(at_offset(
                    self.src,
                    off,
                    format!(
                        "GPU with sm={sm}, but the GPU at {l}:{c} has sm={first}; fabricsim models \
                         nodes of one GPU model"
                    ),
                ));
            }
            _ => {}
        }
        let dev = g.dev.as_deref().and_then(parse_int).unwrap_or(self.gpus.len() as i64);
        let name = format!("gpu{dev}");
        if self.devices.iter().any(|d| d.name == name) {
            return Err(at_offset(self.src, off, format!("two <gpu> elements with dev=\"{dev}\"")));
        }
        let id = self.device(name, DeviceKind::Gpu, None);
        if let Some(par) = parent {
            self.link(id, par, kind, pcie_bw(kind), pcie_lanes(kind));
        }
        if !busid.is_empty() {
            self.busid_dev.insert(busid.to_string(), id);
        }
        self.gpus.push((dev, id, off, busid.to_string()));
        for c in &g.children {
            match c {
                GpuChild::Nvlink(n) => {
                    let noff = self.pos.take("nvlink").unwrap_or(off);
                    let target = n.target.as_deref().map(norm_busid).unwrap_or_default();
                    let count = n.count.as_deref().and_then(parse_int).unwrap_or(1);
                    if !(1..=64).contains(&count) {
                        return Err(at_offset(
                            self.src,
                            noff,
                            format!("<nvlink> count={count}: a GPU has 1 to 18 NVLinks to one target"),
                        ));
                    }
                    let tclass = n.tclass.as_deref().and_then(parse_int);
                    self.nvlinks.push((id, noff, target, count as u32, tclass));
                }
                GpuChild::C2c(c2c) => {
                    let coff = self.pos.take("c2c").unwrap_or(off);
                    let bw = c2c.bw.as_deref().and_then(parse_int).unwrap_or(0);
                    let count = c2c.count.as_deref().and_then(parse_int).unwrap_or(1);
                    if !(1..=100_000_000).contains(&bw) || !(1..=64).contains(&count) {
                        return Err(at_offset(
                            self.src,
                            coff,
                            "<c2c> needs 0 < bw <= 100000000 (MB/s per link, as NVML reports it) and 1 <= count <= 64",
                        ));
                    }
                    let gbps = (bw * count) as f64 / 1000.0;
                    self.c2c.push((id, cpu, Bandwidth::from_gbytes(gbps)));
                }
                GpuChild::Unknown => {}
            }
        }
        Ok(())
    }
}

fn pcie_lanes(kind: LinkKind) -> u32 {
    match kind {
        LinkKind::Pcie { width, .. } => width as u32,
        _ => 1,
    }
}

/// NCCL's model bandwidth of the CPU-to-CPU hop (NCCL_FACTS §5.2), GB/s.
fn inter_socket_gbps(vendor: CpuVendor, intel_model: Option<i64>) -> f64 {
    match vendor {
        CpuVendor::Amd => 16.0,
        CpuVendor::Arm => 6.0,
        CpuVendor::Intel => match intel_model {
            Some(m) if m >= 0xCF => 40.0,
            Some(m) if m >= 0x8F => 22.0,
            Some(m) if m >= 0x55 => 10.0,
            Some(_) => 6.0,
            None => 10.0,
        },
    }
}

/// The default network of an imported node, from its fastest NIC (see the module docs).
fn default_network(rate: Bandwidth) -> NetworkSpec {
    let gb = rate.gbytes();
    let (model, radix, sharp) = if gb >= 100.0 {
        ("Q3400", 144, Some((4, 511)))
    } else if gb >= 50.0 {
        ("QM9700", 64, Some((3, 511)))
    } else if gb >= 25.0 {
        ("QM8700", 40, Some((2, 1)))
    } else {
        ("generic", 64, None)
    };
    NetworkSpec {
        topology: NetTopology::RailOptimized,
        rate,
        link_latency: None,
        switch: SwitchModel {
            model: model.to_string(),
            radix,
            latency: SimTime::from_ns(200),
            sharp: sharp.map(|(generation, max_trees)| SharpSpec {
                generation,
                alu_bw: None,
                max_trees,
                dtypes: ["f32", "f16", "bf16", "f64", "i32"].iter().map(|s| s.to_string()).collect(),
            }),
        },
        nodes_per_su: radix / 2,
        tiers: None,
        two_tier_max_leaves: None,
        oversubscription: 1.0,
        routing: NetRouting::Ecmp,
    }
}

/// Reads an NCCL topology dump (`NCCL_TOPO_DUMP_FILE`) into a validated topology.
pub fn load_nccl_xml(path: &Path) -> Result<TopologySpec, TopologyError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| TopologyError::Io { file: path.display().to_string(), source })?;
    parse_nccl_xml(&text, path)
}

/// Converts the text of an NCCL topology dump; `path` is used for messages and the name.
pub fn parse_nccl_xml(text: &str, path: &Path) -> Result<TopologySpec, TopologyError> {
    let src = Source { path: path.to_path_buf(), text: text.to_string() };
    let pos = scan(&src)?;
    let sys: SystemXml =
        quick_xml::de::from_str(text).map_err(|e| src.invalid(format!("not an NCCL topology dump: {e}")))?;
    let mut b = Builder {
        src: &src,
        pos,
        devices: Vec::new(),
        links: Vec::new(),
        gpus: Vec::new(),
        nics: Vec::new(),
        cpus: Vec::new(),
        busid_dev: BTreeMap::new(),
        nvswitch_busids: BTreeSet::new(),
        nvlinks: Vec::new(),
        c2c: Vec::new(),
        pcilinks: Vec::new(),
        sm: None,
        pcisw: 0,
    };
    b.pos.take("system");
    let mut ncpu = 0;
    for ch in &sys.children {
        match ch {
            SystemChild::Cpu(c) => {
                b.cpu(c, ncpu)?;
                ncpu += 1;
            }
            // A <pci> tree outside any <cpu>: kept, so that the error below can name the GPU
            // that it leaves without a route.
            SystemChild::Pci(p) => b.pci(p, None, None)?,
            SystemChild::Unknown => {}
        }
    }
    let Some((sm, _)) = b.sm else {
        return Err(
            src.invalid("the dump has no <gpu> element (a <gpu dev=.. sm=..> inside a <pci> inside a <cpu>)")
        );
    };

    // CPUs of the node are joined pairwise, as NCCL does.
    let cpus = b.cpus.clone();
    for (i, &(a, va, ma)) in cpus.iter().enumerate() {
        for &(c, _, _) in &cpus[i + 1..] {
            let bw = Bandwidth::from_gbytes(inter_socket_gbps(va, ma));
            b.link(a, c, LinkKind::InterSocket, bw, 1);
        }
    }

    // NVLinks: to the NVSwitch (one device) or to another GPU.
    let gen = nvlink_gen(sm);
    let lane = lane_rate(LinkKind::NvLink { gen }).unwrap_or(Bandwidth(0));
    let mut to_switch: BTreeMap<u32, u32> = BTreeMap::new();
    let mut gpu_pairs: BTreeMap<(u32, u32), u32> = BTreeMap::new();
    let mut chips = BTreeSet::new();
    let nvlinks = std::mem::take(&mut b.nvlinks);
    for (g, off, target, count, tclass) in &nvlinks {
        let is_switch = *tclass == Some(0x068000) || b.nvswitch_busids.contains(target);
        if is_switch {
            let lanes = to_switch.entry(*g).or_insert(0);
            *lanes += count;
            if *lanes > 256 {
                return Err(at_offset(
                    &src,
                    *off,
                    format!(
                        "this GPU has {lanes} NVLinks to NVSwitches; a GPU has at most 18 (256 accepted)"
                    ),
                ));
            }
            chips.insert(target.clone());
            continue;
        }
        match b.busid_dev.get(target) {
            Some(&t) if matches!(b.devices[t as usize].kind, DeviceKind::Gpu) && t != *g => {
                let key = (*g.min(&t), *g.max(&t));
                let e = gpu_pairs.entry(key).or_insert(0);
                *e = (*e).max(*count);
            }
            _ => {
                let gpus: Vec<&str> = b.gpus.iter().map(|x| x.3.as_str()).collect();
                return Err(at_offset(
                    &src,
                    *off,
                    format!(
                        "<nvlink target=\"{target}\"> names neither a GPU of this file nor an NVSwitch \
                         (tclass 0x068000); GPU busids here: {}",
                        gpus.join(", ")
                    ),
                ));
            }
        }
    }
    if !to_switch.is_empty() {
        let sw = b.device(
            "nvswitch".into(),
            DeviceKind::NvSwitch { chips: chips.len().max(1) as u32, nvls: sm >= 90 },
            None,
        );
        for (g, lanes) in to_switch {
            b.link(g, sw, LinkKind::NvLink { gen }, Bandwidth(lane.0.saturating_mul(lanes as u64)), lanes);
        }
    }
    for ((x, y), lanes) in gpu_pairs {
        b.link(x, y, LinkKind::NvLink { gen }, Bandwidth(lane.0.saturating_mul(lanes as u64)), lanes);
    }
    let has_c2c = !b.c2c.is_empty();
    for (g, cpu, bw) in std::mem::take(&mut b.c2c) {
        if let Some(c) = cpu {
            b.link(g, c, LinkKind::C2c, bw, 1);
        }
    }
    for (d, off, target, kind) in std::mem::take(&mut b.pcilinks) {
        match b.busid_dev.get(&target) {
            Some(&t) if t != d => {
                if !b.links.iter().any(|l| (l.a == t && l.b == d) || (l.a == d && l.b == t)) {
                    b.link(d, t, kind, pcie_bw(kind), pcie_lanes(kind));
                }
            }
            _ => {
                return Err(at_offset(
                    &src,
                    off,
                    format!("<pcilink target=\"{target}\"> names no other <pci> element of this file"),
                ))
            }
        }
    }

    // Every GPU must reach the first one. (The builder's check that follows also refuses
    // routes through GPUs or NICs, but cannot point at the element to blame.)
    let n = b.devices.len();
    let mut parent: Vec<usize> = (0..n).collect();
    fn find(p: &mut [usize], mut x: usize) -> usize {
        while p[x] != x {
            p[x] = p[p[x]];
            x = p[x];
        }
        x
    }
    for l in &b.links {
        let (ra, rc) = (find(&mut parent, l.a as usize), find(&mut parent, l.b as usize));
        parent[ra] = rc;
    }
    let mut gpus = b.gpus.clone();
    gpus.sort_by_key(|g| g.0);
    if let Some(first) = gpus.first().cloned() {
        for g in &gpus[1..] {
            if find(&mut parent, g.1 as usize) != find(&mut parent, first.1 as usize) {
                return Err(at_offset(
                    &src,
                    g.2,
                    format!(
                        "GPU dev={} (busid {}) has no route to GPU dev={} (busid {}): it has no <nvlink> \
                         to it or to an NVSwitch, and its <pci> tree reaches no <cpu> of theirs; \
                         place its <pci> element inside a <cpu>, or add its <nvlink> elements",
                        g.0, g.3, first.0, first.3
                    ),
                ));
            }
        }
    }

    // Rails in net dev order.
    let mut nics = b.nics.clone();
    nics.sort_by_key(|x| x.0);
    for (rail, &(_, id)) in nics.iter().enumerate() {
        if let DeviceKind::Nic { rail: r, .. } = &mut b.devices[id as usize].kind {
            *r = rail as u32;
        }
    }
    let fastest = nics
        .iter()
        .filter_map(|&(_, id)| match b.devices[id as usize].kind {
            DeviceKind::Nic { rate, .. } => Some(rate),
            _ => None,
        })
        .max();
    let model = gpu_model(sm, has_c2c).ok_or_else(|| src.invalid(format!("unknown sm {sm}")))?;
    let cpu_vendor = b.cpus.first().map(|c| c.1).unwrap_or(CpuVendor::Intel);
    let [fp64, fp32, tf32, bf16, fp16, fp8, fp4] = model.flops.map(|t| t * 1e12);
    let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let spec = TopologySpec {
        name,
        description: format!(
            "imported from NCCL XML: {} x {}, {} NIC(s)",
            gpus.len(),
            model.model,
            nics.len()
        ),
        gpu: GpuSpec {
            model: model.model.to_string(),
            sm,
            generation: Generation::from_sm(sm),
            sm_count: model.sm_count,
            hbm_bytes: (model.hbm_gb * 1e9) as u64,
            hbm_bw: Bandwidth::from_gbytes(model.hbm_tbps * 1000.0),
            flops: Flops { fp64, fp32, tf32, bf16, fp16, fp8, fp4 },
        },
        node: NodeTemplate {
            devices: b.devices,
            links: b.links,
            gpus: gpus.iter().map(|g| g.1).collect(),
            nics: nics.iter().map(|x| x.1).collect(),
            cpu_vendor,
        },
        cluster: ClusterSpec { default_nodes: 1, domain: None, network: fastest.map(default_network) },
        params: None,
        source: path.to_path_buf(),
    };
    super::build::check_spec(&spec)?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcie_speeds_read_like_nccl() {
        assert_eq!(pcie_kind(Some("32.0 GT/s PCIe"), Some("16")), LinkKind::Pcie { gen: 5, width: 16 });
        assert_eq!(pcie_kind(Some("16 GT/s"), Some("8")), LinkKind::Pcie { gen: 4, width: 8 });
        assert_eq!(pcie_kind(Some("2.5 GT/s PCIe"), None), LinkKind::Pcie { gen: 1, width: 16 });
        assert_eq!(pcie_kind(Some("Unknown"), Some("0")), LinkKind::Pcie { gen: 3, width: 16 });
        assert_eq!(pcie_bw(LinkKind::Pcie { gen: 5, width: 16 }).gbytes(), 63.0);
    }

    #[test]
    fn malformed_xml_is_located() {
        let e =
            parse_nccl_xml("<system version=\"1\">\n  <cpu numaid=\"0\">\n</system>\n", Path::new("t.xml"))
                .unwrap_err()
                .to_string();
        assert!(e.starts_with("t.xml:"), "{e}");
        assert!(e.contains("malformed XML"), "{e}");
    }
}
