//! Charts rendered to PNG and SVG: [`LineChart`] (with log2/log10 axes, human byte units and
//! an optional second panel such as "error per size") and [`BarChart`] (horizontal bars),
//! plus the shared machinery the heatmap uses too: the embedded font, the error type, the
//! stable series palette, tick selection and number formatting.
//!
//! This module is generic: it draws named series of points and knows nothing of
//! collectives or of how the numbers were produced. Well-known series names (`ring`,
//! `tree`, `collnet`, `nvls`, `nvlstree`, `pat`) get fixed colours so that every figure of
//! the gallery agrees; other names get a colour derived from the name itself.
//!
//! The font (DejaVu Sans, `assets/fonts/`) is compiled into the binary and registered with
//! plotters once, so no system font is needed and PNG output is byte-stable. Bad data never
//! panics: non-finite points, and zero or negative values on a log axis, are dropped (see
//! [`LineChart::data_warnings`]); a chart left with nothing to draw is a [`PlotError::NoData`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::units::format_bytes_short;

static FONT_REGULAR: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
static FONT_BOLD: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans-Bold.ttf");
static FONT_ONCE: Once = Once::new();
static FONT_OK: AtomicBool = AtomicBool::new(false);

/// The font family every chart uses; it is the embedded DejaVu Sans.
pub(crate) const FAMILY: &str = "sans-serif";

/// Registers the embedded fonts with plotters (once per process). Every render function
/// calls it; call it yourself only if you draw with plotters directly.
pub fn ensure_fonts() -> Result<(), PlotError> {
    FONT_ONCE.call_once(|| {
        let ok = plotters::style::register_font(FAMILY, FontStyle::Normal, FONT_REGULAR).is_ok()
            && plotters::style::register_font(FAMILY, FontStyle::Bold, FONT_BOLD).is_ok();
        FONT_OK.store(ok, Ordering::SeqCst);
    });
    if FONT_OK.load(Ordering::SeqCst) {
        Ok(())
    } else {
        Err(PlotError::Font)
    }
}

/// Why a chart could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The embedded font was rejected by plotters (a corrupt asset).
    #[error("the embedded DejaVu Sans font could not be registered with plotters")]
    Font,
    /// The output directory could not be created.
    #[error("cannot create output directory {}: {source}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Nothing drawable is left once invalid points are dropped.
    #[error("chart {chart:?} has nothing to plot: {reason}")]
    NoData {
        /// Title of the chart.
        chart: String,
        /// What was missing or dropped.
        reason: String,
    },
    /// The chart description itself is unusable (zero size, bad file stem, ...).
    #[error("chart {chart:?} is invalid: {reason}")]
    Invalid {
        /// Title of the chart.
        chart: String,
        /// What is wrong and what would be valid.
        reason: String,
    },
    /// plotters failed while drawing or writing the file.
    #[error("drawing {} failed: {message}", path.display())]
    Draw {
        /// The file being written.
        path: PathBuf,
        /// plotters' message.
        message: String,
    },
}

// ---------------------------------------------------------------------------------------
// Colours
// ---------------------------------------------------------------------------------------

/// The series palette (matplotlib's tab10 followed by darker companions). Index 0..6 are
/// reserved for the well-known algorithm names, in the order of [`FIXED_COLOURS`].
const PALETTE: [RGBColor; 16] = [
    RGBColor(31, 119, 180),  // blue: ring
    RGBColor(255, 127, 14),  // orange: tree
    RGBColor(44, 160, 44),   // green: collnet / collnetdirect
    RGBColor(214, 39, 40),   // red: nvls
    RGBColor(148, 103, 189), // purple: nvlstree
    RGBColor(140, 86, 75),   // brown: pat
    RGBColor(188, 189, 34),  // olive: collnetchain
    RGBColor(227, 119, 194), // pink
    RGBColor(23, 190, 207),  // cyan
    RGBColor(127, 127, 127), // grey
    RGBColor(0, 63, 92),     // navy
    RGBColor(170, 85, 0),    // rust
    RGBColor(0, 110, 60),    // dark green
    RGBColor(120, 20, 60),   // wine
    RGBColor(90, 60, 150),   // indigo
    RGBColor(60, 60, 60),    // charcoal
];

/// Series names with a fixed palette slot (compared after lower-casing and dropping
/// everything but letters and digits).
const FIXED_COLOURS: [(&str, usize); 7] = [
    ("ring", 0),
    ("tree", 1),
    ("collnet", 2),
    ("collnetdirect", 2),
    ("nvls", 3),
    ("nvlstree", 4),
    ("pat", 5),
];
const FIXED_EXTRA: [(&str, usize); 1] = [("collnetchain", 6)];

fn normalise(name: &str) -> String {
    name.chars().filter(|c| c.is_ascii_alphanumeric()).map(|c| c.to_ascii_lowercase()).collect()
}

/// The fixed palette slot of a well-known name (also when the name merely starts with one,
/// as in `ring/LL128`).
fn fixed_slot(name: &str) -> Option<usize> {
    let norm = normalise(name);
    let first: String = name
        .split(|c: char| !c.is_ascii_alphanumeric())
        .find(|s| !s.is_empty())
        .unwrap_or("")
        .to_ascii_lowercase();
    let table = || FIXED_COLOURS.iter().chain(FIXED_EXTRA.iter());
    table().find(|(n, _)| norm == *n).or_else(|| table().find(|(n, _)| first == *n)).map(|(_, i)| *i)
}

/// Order in which other names take the slots left free: the bright colours first.
const FREE_ORDER: [usize; 16] = [0, 1, 2, 3, 4, 5, 7, 8, 6, 9, 10, 11, 12, 13, 14, 15];

/// Colours for the series names of one figure. Well-known names get their fixed colour
/// (so `ring` is the same blue in every figure); the other names, in order, take the
/// brightest colours that no name of this figure claims. A repeated name repeats its colour.
/// The result depends only on the list of names, so equal legends look equal.
pub(crate) fn assign_colours(names: &[&str]) -> Vec<RGBColor> {
    let mut used = [false; PALETTE.len()];
    let mut slot: Vec<Option<usize>> = vec![None; names.len()];
    // Pass 1: fixed names claim their slot, first come first served.
    for (k, name) in names.iter().enumerate() {
        if let Some(prev) = names[..k].iter().position(|n| n == name) {
            slot[k] = slot[prev];
            continue;
        }
        if let Some(s) = fixed_slot(name).filter(|&s| !used[s]) {
            used[s] = true;
            slot[k] = Some(s);
        }
    }
    // Pass 2: everything else takes the next free slot (cycling once all are taken).
    let mut cycle = 0;
    for k in 0..names.len() {
        if slot[k].is_some() {
            continue;
        }
        if let Some(prev) = names[..k].iter().position(|n| *n == names[k]) {
            slot[k] = slot[prev];
            continue;
        }
        let s = match FREE_ORDER.iter().copied().find(|&s| !used[s]) {
            Some(s) => s,
            None => {
                cycle += 1;
                FREE_ORDER[(cycle - 1) % FREE_ORDER.len()]
            }
        };
        used[s] = true;
        slot[k] = Some(s);
    }
    slot.into_iter().map(|s| PALETTE[s.unwrap_or(0)]).collect()
}

/// The colour of a series of this name when it is alone in its figure, as `(r, g, b)`.
pub fn series_colour(name: &str) -> (u8, u8, u8) {
    let c = PALETTE[fixed_slot(name).unwrap_or(0)];
    (c.0, c.1, c.2)
}

pub(crate) const GRID_LIGHT: RGBColor = RGBColor(238, 238, 238);
pub(crate) const GRID_BOLD: RGBColor = RGBColor(205, 205, 205);
pub(crate) const TEXT_GREY: RGBColor = RGBColor(90, 90, 90);

// ---------------------------------------------------------------------------------------
// Axes
// ---------------------------------------------------------------------------------------

/// How values map onto an axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scale {
    /// Linear.
    #[default]
    Linear,
    /// Logarithmic, ticks at powers of two (message sizes, GPU counts).
    Log2,
    /// Logarithmic, ticks at powers of ten (latencies).
    Log10,
}

impl Scale {
    fn is_log(self) -> bool {
        !matches!(self, Scale::Linear)
    }
    fn fwd(self, v: f64) -> f64 {
        match self {
            Scale::Linear => v,
            Scale::Log2 => v.log2(),
            Scale::Log10 => v.log10(),
        }
    }
    fn inv(self, t: f64) -> f64 {
        match self {
            Scale::Linear => t,
            Scale::Log2 => t.exp2(),
            Scale::Log10 => 10f64.powf(t),
        }
    }
}

/// How tick labels are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TickFormat {
    /// Plain numbers: `0.5`, `20`, `1000`, `1e6`.
    #[default]
    Number,
    /// Human byte units with binary multiples: `8B`, `1K`, `64K`, `1M`, `1G`, `8G`.
    Bytes,
    /// Fractions shown as percentages: `0.25` → `25%`.
    Percent,
}

/// One axis of a chart: its label (with units), scale and tick format.
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    /// The label, units included, e.g. `"message size"` or `"bus bandwidth (GB/s)"`.
    pub label: String,
    /// Linear or logarithmic.
    pub scale: Scale,
    /// How tick labels are written.
    pub format: TickFormat,
}

impl Axis {
    /// A linear axis with plain numbers.
    pub fn linear(label: impl Into<String>) -> Axis {
        Axis { label: label.into(), scale: Scale::Linear, format: TickFormat::Number }
    }
    /// A log2 axis with plain numbers (GPU counts, ...).
    pub fn log2(label: impl Into<String>) -> Axis {
        Axis { label: label.into(), scale: Scale::Log2, format: TickFormat::Number }
    }
    /// A log10 axis with plain numbers (latencies, ...).
    pub fn log10(label: impl Into<String>) -> Axis {
        Axis { label: label.into(), scale: Scale::Log10, format: TickFormat::Number }
    }
    /// A log2 axis of byte counts labelled `8B, 1K, 64K, 1M, 1G` (message sizes).
    pub fn bytes(label: impl Into<String>) -> Axis {
        Axis { label: label.into(), scale: Scale::Log2, format: TickFormat::Bytes }
    }
    /// The same axis with another scale.
    pub fn with_scale(mut self, scale: Scale) -> Axis {
        self.scale = scale;
        self
    }
    /// The same axis with another tick format.
    pub fn with_format(mut self, format: TickFormat) -> Axis {
        self.format = format;
        self
    }
}

/// A resolved axis: range and ticks in transformed space (log2/log10 of the value).
#[derive(Debug, Clone)]
pub(crate) struct AxisPlan {
    pub lo: f64,
    pub hi: f64,
    pub ticks: Vec<f64>,
    pub light: Vec<f64>,
    pub scale: Scale,
    pub format: TickFormat,
    /// Tick spacing in value space, for the number of decimals of linear labels.
    pub step: f64,
}

/// Approximate advance of one character of the tick font (13 px DejaVu Sans).
const TICK_CHAR_PX: f64 = 7.8;

pub(crate) fn text_px(s: &str, font_px: f64) -> f64 {
    // DejaVu Sans averages about 0.6 em per character.
    s.chars().count() as f64 * font_px * 0.6
}

impl AxisPlan {
    /// Plans an axis over `values`, given in transformed space (log2 or log10 of the data
    /// for log scales), `px` pixels long.
    /// `horizontal` decides how crowded labels may be; `include_zero` pulls a linear range
    /// down to zero for non-negative data that starts near it.
    pub fn new(
        values: impl Iterator<Item = f64> + Clone,
        scale: Scale,
        format: TickFormat,
        px: f64,
        horizontal: bool,
        include_zero: bool,
    ) -> Option<AxisPlan> {
        let mut min = f64::INFINITY;
        let mut max = f64::NEG_INFINITY;
        for t in values {
            if t.is_finite() {
                min = min.min(t);
                max = max.max(t);
            }
        }
        if !min.is_finite() || !max.is_finite() {
            return None;
        }
        let (lo, hi) = match scale {
            Scale::Linear => {
                let (mut a, b) = (min, max);
                if include_zero && a >= 0.0 && a <= 0.5 * b {
                    a = 0.0;
                }
                if a == b {
                    let d = if a == 0.0 { 1.0 } else { a.abs() * 0.1 };
                    (a - d, b + d)
                } else {
                    let pad = (b - a) * 0.05;
                    let lo = if a == 0.0 && min >= 0.0 { 0.0 } else { a - pad };
                    (lo, b + pad)
                }
            }
            Scale::Log2 | Scale::Log10 => {
                if min == max {
                    (min - 0.5, max + 0.5)
                } else {
                    let pad = ((max - min) * 0.04).max(0.05);
                    (min - pad, max + pad)
                }
            }
        };
        let mut plan = AxisPlan { lo, hi, ticks: vec![], light: vec![], scale, format, step: 1.0 };
        plan.choose_ticks(px, horizontal);
        Some(plan)
    }

    /// A linear axis over a fixed range (heatmap time, bar values).
    pub fn fixed_linear(lo: f64, hi: f64, format: TickFormat, px: f64, horizontal: bool) -> AxisPlan {
        let (lo, hi) = if hi > lo { (lo, hi) } else { (lo - 1.0, lo + 1.0) };
        let mut plan =
            AxisPlan { lo, hi, ticks: vec![], light: vec![], scale: Scale::Linear, format, step: 1.0 };
        plan.choose_ticks(px, horizontal);
        plan
    }

    fn fits(&self, ticks: &[f64], step: f64, px: f64, horizontal: bool) -> bool {
        if ticks.is_empty() {
            return false;
        }
        let n = ticks.len() as f64;
        if horizontal {
            let widest =
                ticks.iter().map(|&t| self.label_with_step(t, step).chars().count()).max().unwrap_or(1)
                    as f64;
            n * (widest * TICK_CHAR_PX + 18.0) <= px
        } else {
            n * 28.0 <= px
        }
    }

    fn choose_ticks(&mut self, px: f64, horizontal: bool) {
        if self.scale.is_log() && self.choose_log_ticks(px, horizontal) {
            return;
        }
        self.choose_linear_ticks(px, horizontal);
    }

    /// Ticks at integer powers of the base; false when the range holds fewer than two.
    fn choose_log_ticks(&mut self, px: f64, horizontal: bool) -> bool {
        let kmin = self.lo.ceil() as i64;
        let kmax = self.hi.floor() as i64;
        if kmax - kmin < 1 {
            return false;
        }
        let steps: &[i64] = match self.scale {
            Scale::Log2 => &[1, 2, 3, 4, 5, 10, 20, 30],
            _ => &[1, 2, 3, 5, 10, 20],
        };
        let mut chosen = None;
        for &s in steps {
            let ticks: Vec<f64> = (kmin..=kmax).filter(|k| k.rem_euclid(s) == 0).map(|k| k as f64).collect();
            if ticks.len() >= 2 && self.fits(&ticks, 1.0, px, horizontal) {
                chosen = Some((s, ticks));
                break;
            }
        }
        let Some((s, ticks)) = chosen else {
            return false;
        };
        let mut light: Vec<f64> = Vec::new();
        let lo_k = self.lo.floor() as i64;
        let hi_k = self.hi.ceil() as i64;
        match self.scale {
            Scale::Log10 if s == 1 && hi_k - lo_k <= 8 => {
                for k in lo_k..=hi_k {
                    for m in 2..=9 {
                        let t = k as f64 + (m as f64).log10();
                        if t > self.lo && t < self.hi {
                            light.push(t);
                        }
                    }
                }
            }
            _ if s > 1 => {
                for k in lo_k..=hi_k {
                    let t = k as f64;
                    if k.rem_euclid(s) != 0 && t > self.lo && t < self.hi {
                        light.push(t);
                    }
                }
            }
            _ => {}
        }
        self.ticks = ticks;
        self.light = light;
        self.step = 1.0;
        true
    }

    fn choose_linear_ticks(&mut self, px: f64, horizontal: bool) {
        // Work in value space; map back for log axes whose range spans less than a power.
        let (vlo, vhi) = (self.scale.inv(self.lo), self.scale.inv(self.hi));
        let span = vhi - vlo;
        let mut target = if horizontal { (px / 70.0).clamp(2.0, 12.0) } else { (px / 45.0).clamp(2.0, 10.0) };
        let mut best: Option<(f64, Vec<f64>)> = None;
        for _ in 0..8 {
            let step = if self.format == TickFormat::Bytes {
                (span / target).log2().ceil().exp2().max(1.0)
            } else {
                nice_step(span / target)
            };
            if !(step.is_finite() && step > 0.0) {
                break;
            }
            let first = (vlo / step).ceil() as i64;
            let last = (vhi / step).floor() as i64;
            let ticks: Vec<f64> = (first..=last.min(first + 200))
                .map(|k| k as f64 * step)
                .map(|v| if v.abs() < step * 1e-9 { 0.0 } else { v })
                .filter(|&v| !self.scale.is_log() || v > 0.0)
                .map(|v| self.scale.fwd(v))
                .collect();
            let ok = self.fits(&ticks, step, px, horizontal);
            best = Some((step, ticks));
            if ok {
                break;
            }
            target = (target * 0.7).max(1.0);
        }
        if let Some((step, ticks)) = best {
            self.step = step;
            self.ticks = ticks;
        }
        if self.scale.is_log() && self.ticks.len() > 2 {
            // Linear steps bunch up at the top of a log axis: keep ticks far enough apart.
            let per_unit = px / (self.hi - self.lo).max(f64::MIN_POSITIVE);
            let gap = if horizontal {
                self.ticks.iter().map(|&t| self.label(t).chars().count()).max().unwrap_or(1) as f64
                    * TICK_CHAR_PX
                    + 12.0
            } else {
                24.0
            };
            let mut kept: Vec<f64> = Vec::with_capacity(self.ticks.len());
            for &t in &self.ticks {
                if kept.last().is_none_or(|&k| (t - k) * per_unit >= gap) {
                    kept.push(t);
                }
            }
            self.ticks = kept;
        }
        if self.ticks.is_empty() {
            self.ticks = vec![self.lo, self.hi];
            self.step = (self.scale.inv(self.hi) - self.scale.inv(self.lo)).abs().max(f64::MIN_POSITIVE);
        }
        self.light.clear();
    }

    /// The label of a tick at transformed position `t`.
    pub fn label(&self, t: f64) -> String {
        self.label_with_step(t, self.step)
    }

    fn label_with_step(&self, t: f64, step: f64) -> String {
        let v = self.scale.inv(t);
        match self.format {
            TickFormat::Bytes => {
                if v >= 0.5 {
                    format_bytes_short(v.round() as u64)
                } else if v > -0.5 {
                    "0".to_string()
                } else {
                    format!("-{}", format_bytes_short((-v).round() as u64))
                }
            }
            TickFormat::Percent => format!("{}%", format_number(v * 100.0, step * 100.0)),
            TickFormat::Number => {
                if self.scale.is_log() && (t - t.round()).abs() < 1e-9 {
                    format_number(v, v)
                } else {
                    format_number(v, step)
                }
            }
        }
    }
}

/// A step of 1, 2, 2.5 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let mag = 10f64.powf(raw.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * mag >= raw * (1.0 - 1e-9) {
            return m * mag;
        }
    }
    10.0 * mag
}

/// Formats `v` with as many decimals as a tick spacing of `step` needs; very large or very
/// small magnitudes use exponent notation.
pub fn format_number(v: f64, step: f64) -> String {
    if !v.is_finite() {
        return format!("{v}");
    }
    if v == 0.0 {
        return "0".to_string();
    }
    let a = v.abs();
    if !(1e-4..1e6).contains(&a) {
        let s = format!("{v:.1e}");
        // "1.0e6" → "1e6"
        return s.replace(".0e", "e");
    }
    let step = step.abs();
    let decimals = if step > 0.0 && step.is_finite() {
        (-(step.log10() - 1e-9).floor()).clamp(0.0, 6.0) as usize
    } else {
        2
    };
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        let s = s.trim_end_matches('0').trim_end_matches('.');
        s.to_string()
    } else {
        s
    }
}

/// Pixel space left for a chart's plotting area once margins and label areas are taken.
pub(crate) fn approx_plot_px(total: u32, taken: u32) -> f64 {
    (f64::from(total) - f64::from(taken)).max(60.0)
}

// ---------------------------------------------------------------------------------------
// Rendering to files
// ---------------------------------------------------------------------------------------

/// A figure that can be drawn on any plotters backend.
pub(crate) trait Figure {
    fn pixel_size(&self) -> (u32, u32);
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String>;
}

pub(crate) fn de<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> String {
    e.to_string()
}

pub(crate) fn check_common(title: &str, size: (u32, u32), stem: &str) -> Result<(), PlotError> {
    if size.0 < 200 || size.1 < 150 || size.0 > 20_000 || size.1 > 20_000 {
        return Err(PlotError::Invalid {
            chart: title.to_string(),
            reason: format!(
                "size {}x{} pixels is out of range; use 200..20000 by 150..20000",
                size.0, size.1
            ),
        });
    }
    if stem.is_empty()
        || stem.contains(['/', '\\'])
        || stem == "."
        || stem == ".."
        || stem.chars().any(char::is_control)
    {
        return Err(PlotError::Invalid {
            chart: title.to_string(),
            reason: format!("file stem {stem:?} must be a plain, non-empty file name without slashes"),
        });
    }
    Ok(())
}

/// Draws `fig` into `out_dir/stem.png` and `out_dir/stem.svg`.
pub(crate) fn render_files<F: Figure>(
    fig: &F,
    out_dir: &Path,
    stem: &str,
) -> Result<Vec<PathBuf>, PlotError> {
    ensure_fonts()?;
    std::fs::create_dir_all(out_dir)
        .map_err(|source| PlotError::CreateDir { path: out_dir.to_path_buf(), source })?;
    let size = fig.pixel_size();
    let png = out_dir.join(format!("{stem}.png"));
    let svg = out_dir.join(format!("{stem}.svg"));
    {
        let root = BitMapBackend::new(&png, size).into_drawing_area();
        let draw = || -> Result<(), String> {
            root.fill(&WHITE).map_err(de)?;
            fig.draw(&root)?;
            root.present().map_err(de)
        };
        draw().map_err(|message| PlotError::Draw { path: png.clone(), message })?;
    }
    {
        let root = SVGBackend::new(&svg, size).into_drawing_area();
        let draw = || -> Result<(), String> {
            root.fill(&WHITE).map_err(de)?;
            fig.draw(&root)?;
            root.present().map_err(de)
        };
        draw().map_err(|message| PlotError::Draw { path: svg.clone(), message })?;
    }
    Ok(vec![png, svg])
}

/// Draws the title (bold) and optional subtitle at the top of `area`; returns the rest.
pub(crate) fn draw_titles<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    subtitle: Option<&str>,
) -> Result<DrawingArea<DB, Shift>, String> {
    let mut rest = area.clone();
    if !title.is_empty() {
        // FontDesc::style would keep the regular glyphs; load the bold face explicitly.
        let font = FontDesc::new(FontFamily::Name(FAMILY), 21.0, FontStyle::Bold);
        let style = TextStyle::from(font).color(&BLACK);
        rest = rest.titled(title, style).map_err(de)?;
    }
    if let Some(sub) = subtitle.filter(|s| !s.is_empty()) {
        let style = TextStyle::from((FAMILY, 14).into_font()).color(&TEXT_GREY);
        rest = rest.titled(sub, style).map_err(de)?;
    }
    Ok(rest)
}

// ---------------------------------------------------------------------------------------
// Line charts
// ---------------------------------------------------------------------------------------

/// How a series is drawn. The colour comes from the series name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SeriesStyle {
    /// Dashed instead of solid (e.g. a model next to a measurement).
    pub dashed: bool,
    /// A marker at every point.
    pub markers: bool,
}

/// A named series of `(x, y)` points, drawn as a line in the given order.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text; also decides the colour.
    pub name: String,
    /// Points in drawing order (sort them by x for the usual curves).
    pub points: Vec<(f64, f64)>,
    /// Line style.
    pub style: SeriesStyle,
}

impl Series {
    /// A solid series.
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series { name: name.into(), points, style: SeriesStyle::default() }
    }
    /// The same series, dashed.
    pub fn dashed(mut self) -> Series {
        self.style.dashed = true;
        self
    }
    /// The same series, with point markers.
    pub fn markers(mut self) -> Series {
        self.style.markers = true;
        self
    }
}

/// Where the legend goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LegendPos {
    /// The corner of the plot covering the fewest data points.
    #[default]
    Auto,
    /// Upper left corner.
    UpperLeft,
    /// Upper right corner.
    UpperRight,
    /// Lower left corner.
    LowerLeft,
    /// Lower right corner.
    LowerRight,
    /// No legend.
    Hidden,
}

/// A second panel under the main one, sharing its x axis (e.g. "model error per size").
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    /// The panel's y axis.
    pub y: Axis,
    /// Its series (colours follow the names, as in the main panel).
    pub series: Vec<Series>,
    /// A horizontal reference line, e.g. `Some(0.0)` for "no error".
    pub reference: Option<f64>,
}

/// A line chart: labelled axes (linear, log2 or log10, numbers or byte units), any number
/// of named series, a legend and a title; optionally a second panel below.
#[derive(Debug, Clone, PartialEq)]
pub struct LineChart {
    /// Title at the top.
    pub title: String,
    /// Smaller grey line under the title.
    pub subtitle: Option<String>,
    /// The x axis (shared with the second panel).
    pub x: Axis,
    /// The y axis of the main panel.
    pub y: Axis,
    /// The series of the main panel.
    pub series: Vec<Series>,
    /// Optional panel below, on the same x axis.
    pub secondary: Option<Panel>,
    /// Legend position.
    pub legend: LegendPos,
    /// Width and height in pixels (PNG) or user units (SVG).
    pub size: (u32, u32),
}

impl LineChart {
    /// Default size without a second panel.
    pub const DEFAULT_SIZE: (u32, u32) = (800, 500);
    /// Default size with a second panel.
    pub const DEFAULT_SIZE_WITH_PANEL: (u32, u32) = (800, 680);

    /// An empty chart.
    pub fn new(title: impl Into<String>, x: Axis, y: Axis) -> LineChart {
        LineChart {
            title: title.into(),
            subtitle: None,
            x,
            y,
            series: Vec::new(),
            secondary: None,
            legend: LegendPos::Auto,
            size: Self::DEFAULT_SIZE,
        }
    }
    /// Sets the subtitle.
    pub fn subtitle(mut self, s: impl Into<String>) -> LineChart {
        self.subtitle = Some(s.into());
        self
    }
    /// Adds a series.
    pub fn series(mut self, s: Series) -> LineChart {
        self.series.push(s);
        self
    }
    /// Adds a series in place.
    pub fn push_series(&mut self, s: Series) {
        self.series.push(s);
    }
    /// Sets the second panel; grows the default height to make room for it.
    pub fn secondary(mut self, p: Panel) -> LineChart {
        self.secondary = Some(p);
        if self.size == Self::DEFAULT_SIZE {
            self.size = Self::DEFAULT_SIZE_WITH_PANEL;
        }
        self
    }
    /// Sets the size in pixels.
    pub fn size(mut self, width: u32, height: u32) -> LineChart {
        self.size = (width, height);
        self
    }
    /// Sets the legend position.
    pub fn legend(mut self, pos: LegendPos) -> LineChart {
        self.legend = pos;
        self
    }

    /// Human-readable notes about points that will not be drawn (non-finite values, zero
    /// or negative values on a log axis, series with no valid point). Empty when all is well.
    pub fn data_warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut check = |series: &[Series], y: &Axis, panel: &str| {
            for s in series {
                let (_, dropped) = valid_points(&s.points, self.x.scale, y.scale);
                if s.points.is_empty() {
                    out.push(format!("{panel}series {:?} is empty", s.name));
                } else if dropped.total() == s.points.len() {
                    out.push(format!(
                        "{panel}series {:?}: none of its {} points can be drawn ({})",
                        s.name,
                        s.points.len(),
                        dropped.describe(self.x.scale, y.scale)
                    ));
                } else if dropped.total() > 0 {
                    out.push(format!(
                        "{panel}series {:?}: {} of {} points dropped ({})",
                        s.name,
                        dropped.total(),
                        s.points.len(),
                        dropped.describe(self.x.scale, y.scale)
                    ));
                }
            }
        };
        check(&self.series, &self.y, "");
        if let Some(p) = &self.secondary {
            check(&p.series, &p.y, "second panel: ");
        }
        out
    }

    /// Renders `out_dir/stem.png` and `out_dir/stem.svg` (creating `out_dir`) and returns
    /// their paths.
    pub fn render(&self, out_dir: &Path, stem: &str) -> Result<Vec<PathBuf>, PlotError> {
        check_common(&self.title, self.size, stem)?;
        let prepared = self.prepare()?;
        render_files(&prepared, out_dir, stem)
    }

    fn prepare(&self) -> Result<PreparedLine<'_>, PlotError> {
        // Colours are assigned over both panels so that a name has one colour.
        let names: Vec<&str> = self
            .series
            .iter()
            .chain(self.secondary.iter().flat_map(|p| p.series.iter()))
            .map(|s| s.name.as_str())
            .collect();
        let colours = assign_colours(&names);
        let (main_colours, second_colours) = colours.split_at(self.series.len());
        let main = prepare_series(&self.series, main_colours, self.x.scale, self.y.scale);
        let second = self
            .secondary
            .as_ref()
            .map(|p| (p, prepare_series(&p.series, second_colours, self.x.scale, p.y.scale)));
        let any_main = main.iter().any(|s| !s.points.is_empty());
        if !any_main {
            let reason = if self.series.is_empty() {
                "it has no series".to_string()
            } else {
                let w = self.data_warnings();
                format!("no series has a drawable point ({})", w.join("; "))
            };
            return Err(PlotError::NoData { chart: self.title.clone(), reason });
        }
        let (w, h) = self.size;
        let plot_w = approx_plot_px(w, 140);
        let main_h = if second.is_some() { f64::from(h) * 0.62 } else { f64::from(h) };
        let all_x = main
            .iter()
            .chain(second.iter().flat_map(|(_, s)| s.iter()))
            .flat_map(|s| s.points.iter().map(|p| p.0));
        let x = AxisPlan::new(all_x, self.x.scale, self.x.format, plot_w, true, false);
        let y = AxisPlan::new(
            main.iter().flat_map(|s| s.points.iter().map(|p| p.1)),
            self.y.scale,
            self.y.format,
            approx_plot_px(main_h as u32, 130),
            false,
            true,
        );
        let (Some(x), Some(y)) = (x, y) else {
            return Err(PlotError::NoData {
                chart: self.title.clone(),
                reason: "no finite coordinates".to_string(),
            });
        };
        let second = match second {
            None => None,
            Some((p, ser)) => {
                let mut ys: Vec<f64> = ser.iter().flat_map(|s| s.points.iter().map(|q| q.1)).collect();
                if let Some(r) = p.reference.filter(|r| r.is_finite() && (!p.y.scale.is_log() || *r > 0.0)) {
                    ys.push(p.y.scale.fwd(r));
                }
                let plan = AxisPlan::new(
                    ys.iter().copied(),
                    p.y.scale,
                    p.y.format,
                    approx_plot_px((f64::from(h) * 0.38) as u32, 90),
                    false,
                    false,
                );
                plan.map(|plan| (p, ser, plan))
            }
        };
        Ok(PreparedLine { chart: self, x, y, main, second })
    }
}

#[derive(Default)]
struct Dropped {
    non_finite: usize,
    x_nonpositive: usize,
    y_nonpositive: usize,
}

impl Dropped {
    fn total(&self) -> usize {
        self.non_finite + self.x_nonpositive + self.y_nonpositive
    }
    fn describe(&self, xs: Scale, ys: Scale) -> String {
        let mut parts = Vec::new();
        if self.non_finite > 0 {
            parts.push(format!("{} not finite", self.non_finite));
        }
        if self.x_nonpositive > 0 && xs.is_log() {
            parts.push(format!("{} with x <= 0 on a log x axis", self.x_nonpositive));
        }
        if self.y_nonpositive > 0 && ys.is_log() {
            parts.push(format!("{} with y <= 0 on a log y axis", self.y_nonpositive));
        }
        parts.join(", ")
    }
}

fn valid_points(points: &[(f64, f64)], xs: Scale, ys: Scale) -> (Vec<(f64, f64)>, Dropped) {
    let mut d = Dropped::default();
    let mut out = Vec::with_capacity(points.len());
    for &(x, y) in points {
        if !x.is_finite() || !y.is_finite() {
            d.non_finite += 1;
        } else if xs.is_log() && x <= 0.0 {
            d.x_nonpositive += 1;
        } else if ys.is_log() && y <= 0.0 {
            d.y_nonpositive += 1;
        } else {
            out.push((x, y));
        }
    }
    (out, d)
}

struct PreparedSeries<'a> {
    name: &'a str,
    style: SeriesStyle,
    colour: RGBColor,
    /// Points in transformed space.
    points: Vec<(f64, f64)>,
}

fn prepare_series<'a>(
    series: &'a [Series],
    colours: &[RGBColor],
    xs: Scale,
    ys: Scale,
) -> Vec<PreparedSeries<'a>> {
    series
        .iter()
        .zip(colours.iter().copied())
        .map(|(s, colour)| {
            let (pts, _) = valid_points(&s.points, xs, ys);
            PreparedSeries {
                name: &s.name,
                style: s.style,
                colour,
                points: pts.into_iter().map(|(x, y)| (xs.fwd(x), ys.fwd(y))).collect(),
            }
        })
        .collect()
}

struct PreparedLine<'a> {
    chart: &'a LineChart,
    x: AxisPlan,
    y: AxisPlan,
    main: Vec<PreparedSeries<'a>>,
    second: Option<(&'a Panel, Vec<PreparedSeries<'a>>, AxisPlan)>,
}

impl Figure for PreparedLine<'_> {
    fn pixel_size(&self) -> (u32, u32) {
        self.chart.size
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let area = root.margin(8, 4, 6, 6);
        let area = draw_titles(&area, &self.chart.title, self.chart.subtitle.as_deref())?;
        let main = PanelSpec {
            x: &self.x,
            x_label: Some(&self.chart.x.label),
            y: &self.y,
            y_label: &self.chart.y.label,
            y_area: y_label_area(&self.y),
            series: &self.main,
            reference: None,
            legend: self.chart.legend,
        };
        match &self.second {
            None => draw_line_panel(&area, &main),
            Some((panel, series, yplan)) => {
                let (_, h) = area.dim_in_pixel();
                let (top, bottom) = area.split_vertically((f64::from(h) * 0.62) as u32);
                // Both plotting areas start at the same x so the shared axis lines up.
                let y_area = y_label_area(&self.y).max(y_label_area(yplan));
                draw_line_panel(&top, &PanelSpec { x_label: None, y_area, ..main })?;
                let legend = if series.len() > 1 { self.chart.legend } else { LegendPos::Hidden };
                draw_line_panel(
                    &bottom,
                    &PanelSpec {
                        x: &self.x,
                        x_label: Some(&self.chart.x.label),
                        y: yplan,
                        y_label: &panel.y.label,
                        y_area,
                        series,
                        reference: panel
                            .reference
                            .filter(|r| r.is_finite() && (!panel.y.scale.is_log() || *r > 0.0)),
                        legend,
                    },
                )
            }
        }
    }
}

/// Width of the y label area: widest tick label plus room for the rotated axis title.
pub(crate) fn y_label_area(plan: &AxisPlan) -> u32 {
    let widest = plan.ticks.iter().map(|&t| text_px(&plan.label(t), 13.0)).fold(0.0, f64::max);
    (widest + 40.0).clamp(50.0, 200.0) as u32
}

/// What one panel of a line chart draws.
#[derive(Clone, Copy)]
struct PanelSpec<'p, 'a> {
    x: &'p AxisPlan,
    /// `None` leaves the axis title out (the top panel of two).
    x_label: Option<&'p str>,
    y: &'p AxisPlan,
    y_label: &'p str,
    y_area: u32,
    series: &'p [PreparedSeries<'a>],
    reference: Option<f64>,
    legend: LegendPos,
}

fn draw_line_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &PanelSpec<'_, '_>,
) -> Result<(), String> {
    let (x, y, series, legend) = (p.x, p.y, p.series, p.legend);
    let mut chart = ChartBuilder::on(area)
        .margin_top(8)
        .margin_bottom(4)
        .margin_left(6)
        .margin_right(22)
        .x_label_area_size(if p.x_label.is_some() { 46 } else { 28 })
        .y_label_area_size(p.y_area)
        .build_cartesian_2d(Ticked::from(x), Ticked::from(y))
        .map_err(de)?;
    let xf = |v: &f64| x.label(*v);
    let yf = |v: &f64| y.label(*v);
    chart
        .configure_mesh()
        .x_desc(p.x_label.unwrap_or(""))
        .y_desc(p.y_label)
        .x_label_formatter(&xf)
        .y_label_formatter(&yf)
        .label_style((FAMILY, 13))
        .axis_desc_style((FAMILY, 15))
        .light_line_style(GRID_LIGHT)
        .bold_line_style(GRID_BOLD)
        .axis_style(BLACK.stroke_width(1))
        .draw()
        .map_err(de)?;

    if let Some(r) = p.reference {
        let t = y.scale.fwd(r);
        if t > y.lo && t < y.hi {
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(x.lo, t), (x.hi, t)],
                    6,
                    4,
                    ShapeStyle::from(&RGBColor(60, 60, 60)).stroke_width(1),
                ))
                .map_err(de)?;
        }
    }

    let mut labelled = 0;
    for s in series.iter().filter(|s| !s.points.is_empty()) {
        let style = ShapeStyle::from(&s.colour).stroke_width(2);
        let colour = s.colour;
        let dashed = s.style.dashed;
        let markers = s.style.markers || s.points.len() == 1;
        let anno = if dashed {
            chart.draw_series(DashedLineSeries::new(s.points.iter().copied(), 8, 5, style)).map_err(de)?
        } else {
            chart.draw_series(LineSeries::new(s.points.iter().copied(), style)).map_err(de)?
        };
        anno.label(s.name).legend(move |(lx, ly)| {
            let st = ShapeStyle::from(&colour).stroke_width(2);
            let (a, b) = if dashed { ((0, 7), (12, 20)) } else { ((0, 10), (10, 20)) };
            let dot = if markers { colour.filled() } else { colour.mix(0.0).filled() };
            EmptyElement::at((lx, ly))
                + PathElement::new(vec![(a.0, 0), (a.1, 0)], st)
                + PathElement::new(vec![(b.0, 0), (b.1, 0)], st)
                + Circle::new((10, 0), 3, dot)
        });
        labelled += 1;
        if markers {
            chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, colour.filled()))).map_err(de)?;
        }
    }

    if labelled > 0 && legend != LegendPos::Hidden {
        let pos = match legend {
            LegendPos::UpperLeft => SeriesLabelPosition::UpperLeft,
            LegendPos::UpperRight => SeriesLabelPosition::UpperRight,
            LegendPos::LowerLeft => SeriesLabelPosition::LowerLeft,
            LegendPos::LowerRight => SeriesLabelPosition::LowerRight,
            LegendPos::Auto | LegendPos::Hidden => {
                let (pw, ph) = chart.plotting_area().dim_in_pixel();
                auto_legend_corner(series, x, y, (f64::from(pw), f64::from(ph)))
            }
        };
        chart
            .configure_series_labels()
            .position(pos)
            .margin(10)
            .legend_area_size(26)
            .label_font((FAMILY, 14))
            .background_style(WHITE.mix(0.88))
            .border_style(GRID_BOLD)
            .draw()
            .map_err(de)?;
    }
    Ok(())
}

/// Picks the plot corner whose legend box would cover the fewest samples of the series.
fn auto_legend_corner(
    series: &[PreparedSeries<'_>],
    x: &AxisPlan,
    y: &AxisPlan,
    plot_px: (f64, f64),
) -> SeriesLabelPosition {
    let drawn: Vec<&PreparedSeries<'_>> = series.iter().filter(|s| !s.points.is_empty()).collect();
    let widest = drawn.iter().map(|s| text_px(s.name, 14.0)).fold(0.0, f64::max);
    let fw = ((widest + 50.0) / plot_px.0).min(1.0);
    let fh = ((drawn.len() as f64 * 20.0 + 20.0) / plot_px.1).min(1.0);
    // Sample every segment in normalised [0,1]² coordinates.
    let norm = |p: (f64, f64)| ((p.0 - x.lo) / (x.hi - x.lo), (p.1 - y.lo) / (y.hi - y.lo));
    let mut samples: Vec<(f64, f64)> = Vec::new();
    for s in &drawn {
        let pts: Vec<(f64, f64)> = s.points.iter().map(|&p| norm(p)).collect();
        if pts.len() == 1 {
            samples.push(pts[0]);
        }
        for w in pts.windows(2) {
            for i in 0..=24 {
                let f = f64::from(i) / 24.0;
                samples.push((w[0].0 + (w[1].0 - w[0].0) * f, w[0].1 + (w[1].1 - w[0].1) * f));
            }
        }
    }
    let corners = [
        (SeriesLabelPosition::UpperLeft, (0.0, 1.0 - fh), (fw, 1.0)),
        (SeriesLabelPosition::UpperRight, (1.0 - fw, 1.0 - fh), (1.0, 1.0)),
        (SeriesLabelPosition::LowerRight, (1.0 - fw, 0.0), (1.0, fh)),
        (SeriesLabelPosition::LowerLeft, (0.0, 0.0), (fw, fh)),
    ];
    let mut best = (SeriesLabelPosition::UpperLeft, usize::MAX);
    for (pos, lo, hi) in corners {
        let n = samples.iter().filter(|p| p.0 >= lo.0 && p.0 <= hi.0 && p.1 >= lo.1 && p.1 <= hi.1).count();
        if n < best.1 {
            best = (pos, n);
        }
    }
    best.0
}

// ---------------------------------------------------------------------------------------
// Bar charts
// ---------------------------------------------------------------------------------------

/// One horizontal bar.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    /// Category label on the left.
    pub label: String,
    /// Bar length; a non-finite value draws no bar and shows "n/a".
    pub value: f64,
}

/// Horizontal bars, one per category, top to bottom in the given order (e.g. the busiest
/// links and their utilisation).
#[derive(Debug, Clone, PartialEq)]
pub struct BarChart {
    /// Title at the top.
    pub title: String,
    /// Smaller grey line under the title.
    pub subtitle: Option<String>,
    /// Label of the value axis, units included.
    pub value_label: String,
    /// How values are written on the axis and next to each bar.
    pub format: TickFormat,
    /// The bars.
    pub bars: Vec<Bar>,
    /// Fixed upper end of the value axis (e.g. `Some(1.0)` for utilisation).
    pub max_value: Option<f64>,
    /// Bar colour `(r, g, b)`.
    pub colour: (u8, u8, u8),
    /// Width and height in pixels.
    pub size: (u32, u32),
}

impl BarChart {
    /// A bar chart with default size and colour.
    pub fn new(title: impl Into<String>, value_label: impl Into<String>, bars: Vec<Bar>) -> BarChart {
        BarChart {
            title: title.into(),
            subtitle: None,
            value_label: value_label.into(),
            format: TickFormat::Number,
            bars,
            max_value: None,
            colour: (31, 119, 180),
            size: (800, 500),
        }
    }
    /// Sets the subtitle.
    pub fn subtitle(mut self, s: impl Into<String>) -> BarChart {
        self.subtitle = Some(s.into());
        self
    }
    /// Writes values as percentages of 1 and fixes the axis to 0..100%.
    pub fn percent(mut self) -> BarChart {
        self.format = TickFormat::Percent;
        self.max_value = Some(1.0);
        self
    }
    /// Sets the tick format.
    pub fn format(mut self, f: TickFormat) -> BarChart {
        self.format = f;
        self
    }
    /// Sets the size in pixels.
    pub fn size(mut self, width: u32, height: u32) -> BarChart {
        self.size = (width, height);
        self
    }

    /// Renders `out_dir/stem.png` and `out_dir/stem.svg` and returns their paths.
    pub fn render(&self, out_dir: &Path, stem: &str) -> Result<Vec<PathBuf>, PlotError> {
        check_common(&self.title, self.size, stem)?;
        if self.bars.is_empty() {
            return Err(PlotError::NoData { chart: self.title.clone(), reason: "it has no bars".into() });
        }
        let finite: Vec<f64> = self.bars.iter().map(|b| b.value).filter(|v| v.is_finite()).collect();
        if finite.is_empty() {
            return Err(PlotError::NoData {
                chart: self.title.clone(),
                reason: "no bar has a finite value".into(),
            });
        }
        let min = finite.iter().copied().fold(0.0, f64::min);
        let data_max = finite.iter().copied().fold(0.0, f64::max);
        let max = match self.max_value.filter(|m| m.is_finite()) {
            Some(m) => m.max(data_max),
            None => {
                if data_max > 0.0 {
                    data_max * 1.08
                } else {
                    1.0
                }
            }
        };
        let label_w = self.label_area_px();
        let plan =
            AxisPlan::fixed_linear(min, max, self.format, approx_plot_px(self.size.0, label_w + 40), true);
        render_files(&PreparedBars { chart: self, plan, label_w }, out_dir, stem)
    }

    fn label_area_px(&self) -> u32 {
        let widest = self.bars.iter().map(|b| text_px(&b.label, 13.0)).fold(0.0, f64::max);
        (widest + 16.0).clamp(40.0, f64::from(self.size.0) * 0.45) as u32
    }
}

/// Shortens `s` to about `px` pixels at `font_px`, with an ellipsis.
pub(crate) fn truncate_to_px(s: &str, px: f64, font_px: f64) -> String {
    let max_chars = (px / (font_px * 0.6)).floor().max(2.0) as usize;
    if s.chars().count() <= max_chars {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max_chars - 1).collect();
        t.push('…');
        t
    }
}

struct PreparedBars<'a> {
    chart: &'a BarChart,
    plan: AxisPlan,
    label_w: u32,
}

impl Figure for PreparedBars<'_> {
    fn pixel_size(&self) -> (u32, u32) {
        self.chart.size
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let c = self.chart;
        let area = root.margin(8, 4, 6, 6);
        let area = draw_titles(&area, &c.title, c.subtitle.as_deref())?;
        let n = c.bars.len();
        let (_, h) = area.dim_in_pixel();
        let rows_px = approx_plot_px(h, 60);
        let every = ((n as f64 * 15.0 / rows_px).ceil() as usize).max(1);
        let labels: Vec<String> =
            c.bars.iter().map(|b| truncate_to_px(&b.label, f64::from(self.label_w) - 12.0, 13.0)).collect();
        let centres: Vec<f64> = (0..n).step_by(every).map(|i| (n - i) as f64 - 0.5).collect();
        let plan = &self.plan;
        let mut chart = ChartBuilder::on(&area)
            .margin_top(8)
            .margin_bottom(4)
            .margin_left(6)
            .margin_right(24)
            .x_label_area_size(46)
            .y_label_area_size(self.label_w)
            .build_cartesian_2d(Ticked::from(plan), Ticked::new(0.0, n as f64, centres, vec![]))
            .map_err(de)?;
        let xf = |v: &f64| plan.label(*v);
        let yf = |v: &f64| {
            let i = n as f64 - *v - 0.5;
            let i = i.round();
            if i >= 0.0 && (i as usize) < n {
                labels[i as usize].clone()
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .x_desc(c.value_label.as_str())
            .x_label_formatter(&xf)
            .y_label_formatter(&yf)
            .label_style((FAMILY, 13))
            .axis_desc_style((FAMILY, 15))
            .disable_y_mesh()
            .bold_line_style(GRID_BOLD)
            .light_line_style(GRID_LIGHT)
            .axis_style(BLACK.stroke_width(1))
            .draw()
            .map_err(de)?;

        let colour = RGBColor(c.colour.0, c.colour.1, c.colour.2);
        let span = plan.hi - plan.lo;
        let text_style = TextStyle::from((FAMILY, 12).into_font()).color(&BLACK);
        let pw = f64::from(chart.plotting_area().dim_in_pixel().0).max(1.0);
        let bar_px = rows_px / n as f64;
        for (i, b) in c.bars.iter().enumerate() {
            let top = (n - i) as f64 - 0.15;
            let bottom = (n - i) as f64 - 0.85;
            let yc = (n - i) as f64 - 0.5;
            let value_text = if b.value.is_finite() {
                match c.format {
                    TickFormat::Percent => format!("{}%", format_number(b.value * 100.0, 0.1)),
                    TickFormat::Bytes if b.value >= 0.0 => format_bytes_short(b.value.round() as u64),
                    _ => format_number(b.value, (b.value.abs() / 100.0).max(1e-6)),
                }
            } else {
                "n/a".to_string()
            };
            let v = if b.value.is_finite() { b.value.clamp(plan.lo, plan.hi) } else { 0.0 };
            if b.value.is_finite() {
                chart
                    .draw_series(std::iter::once(Rectangle::new([(0.0, bottom), (v, top)], colour.filled())))
                    .map_err(de)?;
            }
            if bar_px < 11.0 {
                continue;
            }
            let text_w = text_px(&value_text, 12.0) + 10.0;
            let inside = (v - plan.lo) / span * pw > text_w + 6.0 && (plan.hi - v) / span * pw < text_w;
            let (x, style) = if inside {
                (v - (text_w - 4.0) / pw * span, text_style.color(&WHITE))
            } else {
                (v.max(0.0) + 4.0 / pw * span, text_style.clone())
            };
            let style = style.pos(Pos::new(HPos::Left, VPos::Center));
            chart.draw_series(std::iter::once(Text::new(value_text, (x, yc), style))).map_err(de)?;
        }
        Ok(())
    }
}

/// A linear f64 coordinate whose tick marks (bold) and minor grid lines (light) are chosen
/// by this module rather than by plotters.
#[derive(Debug, Clone)]
pub(crate) struct Ticked {
    lo: f64,
    hi: f64,
    bold: Vec<f64>,
    light: Vec<f64>,
}

impl Ticked {
    pub(crate) fn new(lo: f64, hi: f64, bold: Vec<f64>, light: Vec<f64>) -> Ticked {
        Ticked { lo, hi, bold, light }
    }
}

impl From<&AxisPlan> for Ticked {
    fn from(p: &AxisPlan) -> Ticked {
        Ticked::new(p.lo, p.hi, p.ticks.clone(), p.light.clone())
    }
}

impl Ranged for Ticked {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let span = self.hi - self.lo;
        if span <= 0.0 || !v.is_finite() {
            return (limit.0 + limit.1) / 2;
        }
        let f = ((v - self.lo) / span).clamp(-4.0, 5.0);
        limit.0 + (f64::from(limit.1 - limit.0) * f + 1e-3).floor() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.light.clone()
        } else {
            self.bold.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(lo: f64, hi: f64, scale: Scale, format: TickFormat) -> AxisPlan {
        AxisPlan::new([scale.fwd(lo), scale.fwd(hi)].into_iter(), scale, format, 640.0, true, false).unwrap()
    }

    #[test]
    fn byte_axis_ticks_are_powers_of_two_with_short_units() {
        let p = plan(8.0, 8.0 * 1024.0 * 1024.0 * 1024.0, Scale::Log2, TickFormat::Bytes);
        let labels: Vec<String> = p.ticks.iter().map(|&t| p.label(t)).collect();
        assert!(labels.contains(&"8B".to_string()), "{labels:?}");
        assert!(labels.contains(&"8G".to_string()), "{labels:?}");
        assert!(labels.len() >= 5 && labels.len() <= 12, "{labels:?}");
        for t in &p.ticks {
            assert_eq!(t.fract(), 0.0);
        }
    }

    #[test]
    fn log10_ticks_are_decades() {
        let p = plan(1.0, 10_000.0, Scale::Log10, TickFormat::Number);
        let labels: Vec<String> = p.ticks.iter().map(|&t| p.label(t)).collect();
        assert_eq!(labels, ["1", "10", "100", "1000", "10000"]);
        assert!(!p.light.is_empty());
    }

    #[test]
    fn narrow_log_range_falls_back_to_linear_ticks() {
        let p = plan(3.0, 5.0, Scale::Log2, TickFormat::Number);
        assert!(p.ticks.len() >= 2);
        for &t in &p.ticks {
            assert!(t >= p.lo && t <= p.hi);
        }
    }

    #[test]
    fn single_value_gets_a_nonempty_range() {
        let p = plan(42.0, 42.0, Scale::Linear, TickFormat::Number);
        assert!(p.hi > p.lo);
        assert!(!p.ticks.is_empty());
        let p = plan(0.0, 0.0, Scale::Linear, TickFormat::Number);
        assert!(p.hi > p.lo);
        let p = plan(1024.0, 1024.0, Scale::Log2, TickFormat::Bytes);
        assert!(p.hi > p.lo);
    }

    #[test]
    fn number_formatting() {
        assert_eq!(format_number(0.0, 1.0), "0");
        assert_eq!(format_number(250.0, 50.0), "250");
        assert_eq!(format_number(0.25, 0.05), "0.25");
        assert_eq!(format_number(1.5, 0.5), "1.5");
        assert_eq!(format_number(2.0e7, 1.0e6), "2e7");
        assert_eq!(format_number(12.0, 2.5), "12");
    }

    #[test]
    fn known_algorithms_have_fixed_distinct_colours() {
        let c = assign_colours(&["tree", "ring", "nvls", "nvlstree", "collnet", "pat"]);
        assert_eq!(c[1], PALETTE[0]);
        assert_eq!(c[0], PALETTE[1]);
        let mut seen = c.clone();
        seen.dedup();
        assert_eq!(seen.len(), 6);
        // Other names take the brightest colours no name of the chart claims.
        let a = assign_colours(&["measured", "ring", "model", "measured"]);
        assert_eq!(a, [PALETTE[1], PALETTE[0], PALETTE[2], PALETTE[1]]);
        // Two series of the same algorithm still differ.
        let r = assign_colours(&["ring/LL", "ring/Simple"]);
        assert_eq!(r[0], PALETTE[0]);
        assert_ne!(r[0], r[1]);
    }

    #[test]
    fn bad_points_are_dropped_and_reported() {
        let chart = LineChart::new("t", Axis::bytes("size"), Axis::log10("time (µs)"))
            .series(Series::new("a", vec![(0.0, 1.0), (8.0, -1.0), (f64::NAN, 2.0), (16.0, 3.0)]));
        let w = chart.data_warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("3 of 4"), "{w:?}");
        let empty = LineChart::new("t", Axis::bytes("size"), Axis::linear("y"))
            .series(Series::new("a", vec![(-1.0, 1.0)]));
        assert!(matches!(empty.prepare(), Err(PlotError::NoData { .. })));
    }

    #[test]
    fn stems_with_slashes_are_rejected() {
        assert!(check_common("t", (800, 500), "a/b").is_err());
        assert!(check_common("t", (800, 500), "").is_err());
        assert!(check_common("t", (10, 500), "a").is_err());
        assert!(check_common("t", (800, 500), "busbw").is_ok());
    }
}
