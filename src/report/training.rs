//! Training-step figures, PNG and SVG with the embedded font like every chart of
//! [`crate::report::plot`]:
//! - the pipeline diagram ([`PipelineChart`]): one row per pipeline stage, one box per pass
//!   (forward, backward, and the weight-gradient pass of zero-bubble schedules) of each
//!   micro-batch, numbered, shaded by model chunk under interleaving, drawn where the step's
//!   timing put it (the analytical timer's or the event engine's); the white space between
//!   boxes is the pipeline bubble, as the Megatron papers draw 1F1B;
//! - stacked horizontal bars ([`StackedBarChart`]): where the step time goes (compute,
//!   exposed TP/CP/EP/PP/DP communication, bubble, optimizer), one bar per plan; and memory
//!   per GPU by category (one bar per stage or per plan) against the HBM line.
//!
//! The charts take plain numbers; [`step_figures`] and the `*_bar` helpers turn a step's
//! [`StepEstimate`] (or a training result row) into them.

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::report::plot::{
    assign_colours, check_common, de, draw_titles, render_files, text_px, PlotError, FAMILY, GRID_BOLD,
    GRID_LIGHT,
};
use crate::scenario::row::TrainingRow;
use crate::workload::analytic::{Breakdown, StepEstimate};
use crate::workload::memory::Memory;
use crate::workload::pipeline::{Pass, PipelineRun};

// ---------------------------------------------------------------------------------------
// Pipeline diagram
// ---------------------------------------------------------------------------------------

/// One pass of one micro-batch through one model chunk on one stage, as it ran.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PassBox {
    /// Pipeline stage (row).
    pub stage: u32,
    /// Micro-batch (the number in the box).
    pub microbatch: u32,
    /// Model chunk on the stage (the shade under interleaving).
    pub chunk: u32,
    /// Forward, backward or weight-gradient pass.
    pub pass: Pass,
    /// Start, seconds from the step's start.
    pub start: f64,
    /// End, seconds.
    pub end: f64,
}

/// The pipeline-schedule diagram of one step.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineChart {
    /// Title at the top.
    pub title: String,
    /// Smaller line under the title.
    pub subtitle: Option<String>,
    /// Stages (rows), stage 0 at the top.
    pub stages: u32,
    /// Model chunks per stage.
    pub chunks: u32,
    /// Every pass.
    pub passes: Vec<PassBox>,
    /// Width and height in pixels.
    pub size: (u32, u32),
}

impl PipelineChart {
    /// The diagram of a timed pipeline: every op of every stage at its start and end.
    pub fn from_run(title: impl Into<String>, run: &PipelineRun) -> PipelineChart {
        let s = &run.schedule;
        let mut passes = Vec::new();
        for (stage, ops) in s.ops.iter().enumerate() {
            for (i, o) in ops.iter().enumerate() {
                let (start, end) = (run.timing.start[stage][i], run.timing.end[stage][i]);
                passes.push(PassBox {
                    stage: stage as u32,
                    microbatch: o.mb,
                    chunk: o.chunk,
                    pass: o.pass,
                    start,
                    end,
                });
            }
        }
        let rows = s.stages.clamp(1, 64);
        let height = (170 + 40 * rows).clamp(340, 2400);
        PipelineChart {
            title: title.into(),
            subtitle: None,
            stages: s.stages,
            chunks: s.chunks,
            passes,
            size: (1200, height),
        }
    }

    /// Sets the subtitle.
    pub fn subtitle(mut self, s: impl Into<String>) -> PipelineChart {
        self.subtitle = Some(s.into());
        self
    }

    /// When the last pass ends.
    pub fn makespan(&self) -> f64 {
        self.passes.iter().map(|p| p.end).fold(0.0, f64::max)
    }

    /// Per stage, the share of the makespan it is idle (the bubble as drawn).
    pub fn idle_share(&self) -> Vec<f64> {
        let span = self.makespan();
        (0..self.stages)
            .map(|s| {
                let busy: f64 =
                    self.passes.iter().filter(|p| p.stage == s).map(|p| (p.end - p.start).max(0.0)).sum();
                if span > 0.0 {
                    (1.0 - busy / span).max(0.0)
                } else {
                    0.0
                }
            })
            .collect()
    }

    /// Renders `out_dir/stem.png` and `out_dir/stem.svg` (creating `out_dir`).
    pub fn render(&self, out_dir: &Path, stem: &str) -> Result<Vec<PathBuf>, PlotError> {
        check_common(&self.title, self.size, stem)?;
        let bad = self.passes.iter().find(|p| {
            !p.start.is_finite() || !p.end.is_finite() || p.end < p.start || p.stage >= self.stages
        });
        if self.passes.is_empty() || self.makespan() <= 0.0 {
            return Err(PlotError::NoData {
                chart: self.title.clone(),
                reason: "it has no timed pass".into(),
            });
        }
        if let Some(p) = bad {
            return Err(PlotError::Invalid {
                chart: self.title.clone(),
                reason: format!("pass {p:?} is not a finite interval on one of the {} stages", self.stages),
            });
        }
        render_files(self, out_dir, stem)
    }
}

/// The time axis runs this far past the makespan, leaving room for the legend.
const LEGEND_ROOM: f64 = 1.16;

/// Colour of a pass: forward blue, backward orange, weight gradient purple; later chunks
/// lighter.
fn pass_colour(pass: Pass, chunk: u32, chunks: u32) -> RGBColor {
    let base = match pass {
        Pass::F => (31.0, 119.0, 180.0),
        Pass::B => (230.0, 120.0, 20.0),
        Pass::W => (140.0, 86.0, 180.0),
    };
    let t = if chunks > 1 { 0.55 * f64::from(chunk) / f64::from(chunks - 1) } else { 0.0 };
    let mix = |c: f64| (c + (255.0 - c) * t).round() as u8;
    RGBColor(mix(base.0), mix(base.1), mix(base.2))
}

fn pass_name(pass: Pass) -> &'static str {
    match pass {
        Pass::F => "forward",
        Pass::B => "backward",
        Pass::W => "weight gradient",
    }
}

impl crate::report::plot::Figure for PipelineChart {
    fn pixel_size(&self) -> (u32, u32) {
        self.size
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let area = root.margin(8, 4, 6, 6);
        let area = draw_titles(&area, &self.title, self.subtitle.as_deref())?;
        let span = self.makespan();
        let n = self.stages.max(1);
        let nf = f64::from(n);
        let (scale, unit) = if span >= 1.0 { (1.0, "s") } else { (1e3, "ms") };
        let mut chart = ChartBuilder::on(&area)
            .margin_top(6)
            .margin_right(24)
            .x_label_area_size(46)
            .y_label_area_size(78)
            .build_cartesian_2d(0.0..span * scale * LEGEND_ROOM, 0.0..nf)
            .map_err(de)?;
        let yf = |v: &f64| {
            let s = (nf - *v - 0.5).round();
            if (0.0..nf).contains(&s) && (nf - *v - 0.5 - s).abs() < 0.01 {
                format!("stage {}", s as u32)
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .x_desc(format!("time in the step ({unit})"))
            .y_labels((2 * n + 1) as usize)
            .y_label_formatter(&yf)
            .label_style((FAMILY, 13))
            .axis_desc_style((FAMILY, 15))
            .disable_y_mesh()
            .bold_line_style(GRID_BOLD)
            .light_line_style(GRID_LIGHT)
            .draw()
            .map_err(de)?;
        // Row bands: the idle time shows as the light band between boxes.
        let band = RGBColor(246, 246, 246);
        chart
            .draw_series((0..n).map(|s| {
                let y = nf - f64::from(s);
                Rectangle::new([(0.0, y - 0.9), (span * scale, y - 0.1)], band.filled())
            }))
            .map_err(de)?;
        let pw = f64::from(chart.plotting_area().dim_in_pixel().0).max(1.0);
        let px_per_unit = pw / (span * scale * LEGEND_ROOM);
        let row_px = f64::from(chart.plotting_area().dim_in_pixel().1) / nf;
        let font = (row_px * 0.45).clamp(7.0, 13.0);
        let text = TextStyle::from((FAMILY, font).into_font())
            .color(&WHITE)
            .pos(Pos::new(HPos::Center, VPos::Center));
        for p in &self.passes {
            let y = nf - f64::from(p.stage);
            let (x0, x1) = (p.start * scale, p.end * scale);
            let c = pass_colour(p.pass, p.chunk, self.chunks);
            chart
                .draw_series(std::iter::once(Rectangle::new([(x0, y - 0.88), (x1, y - 0.12)], c.filled())))
                .map_err(de)?;
            if (x1 - x0) * px_per_unit >= 4.0 {
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(x0, y - 0.88), (x1, y - 0.12)],
                        WHITE.stroke_width(1),
                    )))
                    .map_err(de)?;
            }
            let label = (p.microbatch + 1).to_string();
            if (x1 - x0) * px_per_unit > text_px(&label, font) + 4.0 && row_px > 10.0 {
                chart
                    .draw_series(std::iter::once(Text::new(label, ((x0 + x1) / 2.0, y - 0.5), text.clone())))
                    .map_err(de)?;
            }
        }
        // Legend: the passes present (chunk 0's shade; later chunks are lighter).
        let mut keys: Vec<(String, RGBColor)> = Vec::new();
        for pass in [Pass::F, Pass::B, Pass::W] {
            if self.passes.iter().any(|p| p.pass == pass) {
                keys.push((pass_name(pass).to_string(), pass_colour(pass, 0, self.chunks)));
            }
        }
        if self.chunks > 1 {
            keys.push((
                format!("chunk {} (lightest)", self.chunks - 1),
                pass_colour(Pass::F, self.chunks - 1, self.chunks),
            ));
        }
        for (name, c) in keys {
            chart
                .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())
                .map_err(de)?
                .label(name)
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)
    }
}

// ---------------------------------------------------------------------------------------
// Stacked bars
// ---------------------------------------------------------------------------------------

/// One horizontal bar made of one segment per category.
#[derive(Debug, Clone, PartialEq)]
pub struct StackedBar {
    /// Label on the left.
    pub label: String,
    /// One value per category of the chart, in its order (negative values count as 0).
    pub values: Vec<f64>,
}

impl StackedBar {
    /// The bar's length: its segments added up.
    pub fn total(&self) -> f64 {
        self.values.iter().map(|v| v.max(0.0)).sum()
    }
}

/// Horizontal stacked bars, top to bottom in the given order.
#[derive(Debug, Clone, PartialEq)]
pub struct StackedBarChart {
    /// Title at the top.
    pub title: String,
    /// Smaller line under the title.
    pub subtitle: Option<String>,
    /// Label of the value axis, units included.
    pub value_label: String,
    /// Segment names, in stacking order (the legend; they decide the colours).
    pub categories: Vec<String>,
    /// The bars.
    pub bars: Vec<StackedBar>,
    /// A vertical reference line and its label (the HBM capacity).
    pub limit: Option<(f64, String)>,
    /// Width and height in pixels.
    pub size: (u32, u32),
}

impl StackedBarChart {
    /// A chart sized for its bars.
    pub fn new(
        title: impl Into<String>,
        value_label: impl Into<String>,
        categories: Vec<String>,
        bars: Vec<StackedBar>,
    ) -> StackedBarChart {
        let height = (170 + 40 * bars.len() as u32).clamp(260, 4000);
        StackedBarChart {
            title: title.into(),
            subtitle: None,
            value_label: value_label.into(),
            categories,
            bars,
            limit: None,
            size: (1000, height),
        }
    }

    /// Sets the subtitle.
    pub fn subtitle(mut self, s: impl Into<String>) -> StackedBarChart {
        self.subtitle = Some(s.into());
        self
    }

    /// Draws a vertical line at `value`, named `label` in the legend.
    pub fn limit(mut self, value: f64, label: impl Into<String>) -> StackedBarChart {
        self.limit = Some((value, label.into()));
        self
    }

    /// Renders `out_dir/stem.png` and `out_dir/stem.svg` (creating `out_dir`).
    pub fn render(&self, out_dir: &Path, stem: &str) -> Result<Vec<PathBuf>, PlotError> {
        check_common(&self.title, self.size, stem)?;
        if self.bars.is_empty() {
            return Err(PlotError::NoData { chart: self.title.clone(), reason: "it has no bars".into() });
        }
        if let Some(b) = self.bars.iter().find(|b| b.values.len() != self.categories.len()) {
            return Err(PlotError::Invalid {
                chart: self.title.clone(),
                reason: format!(
                    "bar {:?} has {} values for {} categories",
                    b.label,
                    b.values.len(),
                    self.categories.len()
                ),
            });
        }
        if self.bars.iter().flat_map(|b| &b.values).any(|v| !v.is_finite()) {
            return Err(PlotError::Invalid {
                chart: self.title.clone(),
                reason: "a value is not finite".into(),
            });
        }
        if self.bars.iter().all(|b| b.total() <= 0.0) {
            return Err(PlotError::NoData { chart: self.title.clone(), reason: "every bar is empty".into() });
        }
        render_files(self, out_dir, stem)
    }

    fn label_px(&self) -> u32 {
        let widest = self.bars.iter().map(|b| text_px(&b.label, 13.0)).fold(0.0, f64::max);
        (widest + 16.0).clamp(60.0, f64::from(self.size.0) * 0.4) as u32
    }
}

impl crate::report::plot::Figure for StackedBarChart {
    fn pixel_size(&self) -> (u32, u32) {
        self.size
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let area = root.margin(8, 4, 6, 6);
        let area = draw_titles(&area, &self.title, self.subtitle.as_deref())?;
        let n = self.bars.len();
        let nf = n as f64;
        let mut hi = self.bars.iter().map(StackedBar::total).fold(0.0, f64::max);
        if let Some((v, _)) = &self.limit {
            hi = hi.max(*v);
        }
        let hi = (hi * 1.3).max(1e-12);
        let label_w = self.label_px();
        let mut chart = ChartBuilder::on(&area)
            .margin_top(6)
            .margin_right(24)
            .x_label_area_size(46)
            .y_label_area_size(label_w)
            .build_cartesian_2d(0.0..hi, 0.0..nf)
            .map_err(de)?;
        let labels: Vec<String> = self
            .bars
            .iter()
            .map(|b| crate::report::plot::truncate_to_px(&b.label, f64::from(label_w) - 12.0, 13.0))
            .collect();
        let yf = |v: &f64| {
            let i = (nf - *v - 0.5).round();
            if (0.0..nf).contains(&i) && (nf - *v - 0.5 - i).abs() < 0.01 {
                labels[i as usize].clone()
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .x_desc(self.value_label.as_str())
            .y_labels(2 * n + 1)
            .y_label_formatter(&yf)
            .label_style((FAMILY, 13))
            .axis_desc_style((FAMILY, 15))
            .disable_y_mesh()
            .bold_line_style(GRID_BOLD)
            .light_line_style(GRID_LIGHT)
            .draw()
            .map_err(de)?;
        let names: Vec<&str> = self.categories.iter().map(String::as_str).collect();
        let colours = assign_colours(&names);
        for (i, b) in self.bars.iter().enumerate() {
            let y = nf - i as f64;
            let mut x = 0.0;
            for (v, c) in b.values.iter().zip(&colours) {
                let v = v.max(0.0);
                if v > 0.0 {
                    chart
                        .draw_series(std::iter::once(Rectangle::new(
                            [(x, y - 0.85), (x + v, y - 0.15)],
                            c.filled(),
                        )))
                        .map_err(de)?;
                }
                x += v;
            }
            let style = TextStyle::from((FAMILY, 12).into_font())
                .color(&BLACK)
                .pos(Pos::new(HPos::Left, VPos::Center));
            chart
                .draw_series(std::iter::once(Text::new(short(x), (x + hi * 0.005, y - 0.5), style)))
                .map_err(de)?;
        }
        for (name, c) in self.categories.iter().zip(colours) {
            if self
                .bars
                .iter()
                .all(|b| b.values[self.categories.iter().position(|k| k == name).unwrap_or(0)] <= 0.0)
            {
                continue;
            }
            chart
                .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())
                .map_err(de)?
                .label(name.as_str())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
        }
        if let Some((v, label)) = &self.limit {
            let red = RGBColor(200, 30, 30);
            chart
                .draw_series(LineSeries::new([(*v, 0.0), (*v, nf)], red.stroke_width(2)))
                .map_err(de)?
                .label(label.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 14, y)], red.stroke_width(2)));
        }
        legend(&mut chart, SeriesLabelPosition::LowerRight)
    }
}

/// The legend box of the training figures, at `pos`.
fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    pos: SeriesLabelPosition,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .position(pos)
        .label_font((FAMILY, 12))
        .background_style(WHITE.mix(0.9))
        .border_style(RGBColor(200, 200, 200))
        .draw()
        .map_err(de)
}

/// A value with three significant digits.
fn short(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

// ---------------------------------------------------------------------------------------
// From training steps
// ---------------------------------------------------------------------------------------

/// The segments of a step-time bar, in order.
pub const BREAKDOWN_PARTS: [&str; 8] =
    ["compute", "exposed TP", "exposed CP", "exposed EP", "exposed PP", "exposed DP", "bubble", "optimizer"];

/// The segments of a memory bar, in order (as [`Memory::parts`] names them).
pub const MEMORY_PARTS: [&str; 5] =
    ["parameters", "gradients", "optimizer states", "activations", "communication buffers"];

/// A step-time bar from a breakdown, in seconds (its total is [`Breakdown::total`]).
pub fn breakdown_bar(label: impl Into<String>, b: &Breakdown) -> StackedBar {
    StackedBar {
        label: label.into(),
        values: vec![b.compute, b.tp, b.cp, b.ep, b.pp, b.dp, b.bubble, b.optimizer],
    }
}

/// A step-time bar from a training result row, in seconds.
pub fn row_breakdown_bar(label: impl Into<String>, r: &TrainingRow) -> StackedBar {
    StackedBar {
        label: label.into(),
        values: vec![r.compute_s, r.tp_s, r.cp_s, r.ep_s, r.pp_s, r.dp_s, r.bubble_s, r.optimizer_s],
    }
}

const GIB: f64 = (1u64 << 30) as f64;

/// A memory bar from one stage's memory, in GiB.
pub fn memory_bar(label: impl Into<String>, m: &Memory) -> StackedBar {
    StackedBar { label: label.into(), values: m.parts().iter().map(|(_, v)| *v as f64 / GIB).collect() }
}

/// The step-time chart of several plans.
pub fn breakdown_chart(title: impl Into<String>, bars: Vec<StackedBar>) -> StackedBarChart {
    StackedBarChart::new(
        title,
        "step time (s)",
        BREAKDOWN_PARTS.iter().map(|s| s.to_string()).collect(),
        bars,
    )
}

/// The memory chart of several stages or plans against `hbm` bytes per GPU.
pub fn memory_chart(title: impl Into<String>, bars: Vec<StackedBar>, hbm: u64) -> StackedBarChart {
    StackedBarChart::new(
        title,
        "memory per GPU (GiB)",
        MEMORY_PARTS.iter().map(|s| s.to_string()).collect(),
        bars,
    )
    .limit(hbm as f64 / GIB, format!("HBM {:.0} GiB", hbm as f64 / GIB))
}

/// The pipeline diagram of a timed step as `out_dir/stem.{png,svg}`, with a subtitle naming
/// the schedule and the bubble share.
pub fn pipeline_figure(
    out_dir: &Path,
    stem: &str,
    title: &str,
    run: &PipelineRun,
) -> Result<Vec<PathBuf>, PlotError> {
    let sched = &run.schedule;
    let sub = format!(
        "{} schedule, {} stages x {} chunk(s), {} micro-batches; boxes numbered by micro-batch, white space is the bubble ({:.1}% of the busiest stage)",
        sched.kind.name(),
        sched.stages,
        sched.chunks,
        sched.microbatches,
        100.0 * run.timing.bubble_fraction()
    );
    PipelineChart::from_run(format!("{title}: pipeline schedule"), run).subtitle(sub).render(out_dir, stem)
}

/// Memory per GPU by category of every stage of a step against `hbm` bytes, as
/// `out_dir/stem.{png,svg}`.
pub fn memory_figure(
    out_dir: &Path,
    stem: &str,
    title: &str,
    est: &StepEstimate,
    hbm: u64,
) -> Result<Vec<PathBuf>, PlotError> {
    let bars: Vec<StackedBar> =
        est.memory_by_stage.iter().map(|m| memory_bar(format!("stage {}", m.stage), m)).collect();
    memory_chart(format!("{title}: memory per GPU by stage"), bars, hbm)
        .subtitle(format!("largest: stage {}, {:.1} GiB", est.memory.stage, est.memory.total() as f64 / GIB))
        .render(out_dir, stem)
}

/// The figures of one step, written into `out_dir` as `{prefix}pipeline`, `{prefix}breakdown`
/// and `{prefix}memory` (PNG and SVG each): the pipeline diagram (when the step was timed
/// pass by pass), the step-time bar, and memory per GPU of every stage against `hbm`.
pub fn step_figures(
    out_dir: &Path,
    prefix: &str,
    title: &str,
    est: &StepEstimate,
    hbm: u64,
) -> Result<Vec<PathBuf>, PlotError> {
    let mut files = Vec::new();
    if let Some(run) = &est.pipeline {
        files.extend(pipeline_figure(out_dir, &format!("{prefix}pipeline"), title, run)?);
    }
    let bars = vec![breakdown_bar(format!("step {:.3} s", est.step_time_s), &est.breakdown)];
    let chart = breakdown_chart(format!("{title}: where the step time goes"), bars).subtitle(format!(
        "step {:.3} s, MFU {:.1}%; exposed communication is what the critical path shows",
        est.step_time_s,
        100.0 * est.mfu
    ));
    files.extend(chart.render(out_dir, &format!("{prefix}breakdown"))?);
    files.extend(memory_figure(out_dir, &format!("{prefix}memory"), title, est, hbm)?);
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_shades_lighten_and_passes_differ() {
        let a = pass_colour(Pass::F, 0, 3);
        let b = pass_colour(Pass::F, 2, 3);
        assert!(b.0 > a.0 && b.1 > a.1 && b.2 > a.2);
        assert_ne!(pass_colour(Pass::F, 0, 1), pass_colour(Pass::B, 0, 1));
        assert_eq!(short(0.1234), "0.123");
        assert_eq!(short(123.4), "123");
    }
}
