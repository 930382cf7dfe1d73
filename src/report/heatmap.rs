//! Heatmaps of utilisation over time: one row per named track (a link, a switch, a rank),
//! one column per time bin, each cell coloured by a value in 0..1, with a colour bar and a
//! time axis in microseconds. Rendered to PNG and SVG like every chart of
//! [`crate::report::plot`].
//!
//! Large inputs are reduced before drawing: columns are averaged down to about one per
//! pixel and so are rows, and runs of equal colour in a row become one rectangle, so the SVG
//! stays small even for thousands of links over thousands of bins.

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::report::plot::{
    approx_plot_px, check_common, de, draw_titles, render_files, text_px, truncate_to_px, AxisPlan, Figure,
    PlotError, TickFormat, Ticked, FAMILY, GRID_BOLD,
};
use crate::units::SimTime;

/// One row of a heatmap.
#[derive(Debug, Clone, PartialEq)]
pub struct HeatTrack {
    /// Row label (a link or device name).
    pub name: String,
    /// One value per time bin, nominally in 0..1; values outside are clamped, non-finite
    /// values are drawn as "no data" (light grey). A shorter row ends early with no data.
    pub values: Vec<f64>,
}

/// A heatmap: rows are tracks, columns are equal time bins starting at `start`.
#[derive(Debug, Clone, PartialEq)]
pub struct Heatmap {
    /// Title at the top.
    pub title: String,
    /// Smaller grey line under the title.
    pub subtitle: Option<String>,
    /// Time of the left edge of the first bin.
    pub start: SimTime,
    /// Width of one bin (must be positive).
    pub bin: SimTime,
    /// The rows, top to bottom.
    pub tracks: Vec<HeatTrack>,
    /// Label of the colour bar, e.g. `"utilisation"`.
    pub value_label: String,
    /// Width and height in pixels.
    pub size: (u32, u32),
}

const NO_DATA: RGBColor = RGBColor(225, 225, 225);
const COLOUR_BAR_W: u32 = 96;

impl Heatmap {
    /// A heatmap with the default size (900x500) and colour-bar label "utilisation".
    pub fn new(title: impl Into<String>, start: SimTime, bin: SimTime, tracks: Vec<HeatTrack>) -> Heatmap {
        Heatmap {
            title: title.into(),
            subtitle: None,
            start,
            bin,
            tracks,
            value_label: "utilisation".to_string(),
            size: (900, 500),
        }
    }
    /// Sets the subtitle.
    pub fn subtitle(mut self, s: impl Into<String>) -> Heatmap {
        self.subtitle = Some(s.into());
        self
    }
    /// Sets the colour-bar label.
    pub fn value_label(mut self, s: impl Into<String>) -> Heatmap {
        self.value_label = s.into();
        self
    }
    /// Sets the size in pixels.
    pub fn size(mut self, width: u32, height: u32) -> Heatmap {
        self.size = (width, height);
        self
    }

    /// Renders `out_dir/stem.png` and `out_dir/stem.svg` and returns their paths.
    pub fn render(&self, out_dir: &Path, stem: &str) -> Result<Vec<PathBuf>, PlotError> {
        check_common(&self.title, self.size, stem)?;
        if self.bin == SimTime::ZERO {
            return Err(PlotError::Invalid {
                chart: self.title.clone(),
                reason: "the time bin is zero; use a positive bin width".into(),
            });
        }
        let bins = self.tracks.iter().map(|t| t.values.len()).max().unwrap_or(0);
        if self.tracks.is_empty() || bins == 0 {
            return Err(PlotError::NoData {
                chart: self.title.clone(),
                reason: "it has no tracks or no time bins".into(),
            });
        }
        let (w, h) = self.size;
        let plot_h = approx_plot_px(h, 130).max(1.0) as usize;
        let row_group = self.tracks.len().div_ceil(plot_h).max(1);
        let names: Vec<String> = self
            .tracks
            .chunks(row_group)
            .map(|rows| match rows {
                [one] => one.name.clone(),
                [first, .., last] => format!("{} – {}", first.name, last.name),
                [] => String::new(),
            })
            .collect();
        let widest = names.iter().map(|n| text_px(n, 12.0)).fold(0.0, f64::max);
        let label_w = (widest + 16.0).clamp(40.0, f64::from(w) * 0.35) as u32;
        let names: Vec<String> =
            names.iter().map(|n| truncate_to_px(n, f64::from(label_w) - 12.0, 12.0)).collect();
        let plot_w = approx_plot_px(w, label_w + COLOUR_BAR_W + 40).max(1.0) as usize;
        let col_group = bins.div_ceil(plot_w).max(1);
        let grid = reduce(&self.tracks, bins, col_group, row_group);
        let t0 = self.start.as_us();
        let t1 = (self.start + SimTime(self.bin.0.saturating_mul(bins as u64))).as_us();
        let x = AxisPlan::fixed_linear(t0, t1, TickFormat::Number, plot_w as f64, true);
        let cell_us = self.bin.as_us() * col_group as f64;
        render_files(&PreparedHeat { map: self, grid, names, cell_us, t0, x, label_w }, out_dir, stem)
    }
}

/// Averages `col_group` bins by `row_group` tracks into one cell (ignoring non-finite
/// values; a cell with none is NaN).
fn reduce(tracks: &[HeatTrack], bins: usize, col_group: usize, row_group: usize) -> Vec<Vec<f64>> {
    let cols = bins.div_ceil(col_group);
    tracks
        .chunks(row_group)
        .map(|rows| {
            (0..cols)
                .map(|c| {
                    let (mut sum, mut n) = (0.0, 0usize);
                    for r in rows {
                        let lo = c * col_group;
                        let hi = ((c + 1) * col_group).min(r.values.len());
                        for &v in r.values.get(lo..hi).unwrap_or(&[]) {
                            if v.is_finite() {
                                sum += v.clamp(0.0, 1.0);
                                n += 1;
                            }
                        }
                    }
                    if n == 0 {
                        f64::NAN
                    } else {
                        sum / n as f64
                    }
                })
                .collect()
        })
        .collect()
}

/// Anchor colours of the viridis colour map at 0, 1/8, ..., 1.
const VIRIDIS: [(u8, u8, u8); 9] = [
    (68, 1, 84),
    (70, 50, 126),
    (54, 92, 141),
    (39, 127, 142),
    (31, 161, 135),
    (74, 193, 109),
    (160, 218, 57),
    (223, 227, 24),
    (253, 231, 37),
];

/// Colour of `v` in 0..1 on a viridis-like scale (quantised to 256 levels so equal-looking
/// neighbours merge); non-finite values get the "no data" grey.
pub fn colour_map(v: f64) -> (u8, u8, u8) {
    if !v.is_finite() {
        return (NO_DATA.0, NO_DATA.1, NO_DATA.2);
    }
    let q = (v.clamp(0.0, 1.0) * 255.0).round() / 255.0;
    let pos = q * (VIRIDIS.len() - 1) as f64;
    let i = (pos.floor() as usize).min(VIRIDIS.len() - 2);
    let f = pos - i as f64;
    let lerp = |a: u8, b: u8| (f64::from(a) + (f64::from(b) - f64::from(a)) * f).round() as u8;
    let (a, b) = (VIRIDIS[i], VIRIDIS[i + 1]);
    (lerp(a.0, b.0), lerp(a.1, b.1), lerp(a.2, b.2))
}

struct PreparedHeat<'a> {
    map: &'a Heatmap,
    grid: Vec<Vec<f64>>,
    /// Row labels after reduction (already shortened to fit).
    names: Vec<String>,
    cell_us: f64,
    t0: f64,
    x: AxisPlan,
    label_w: u32,
}

impl Figure for PreparedHeat<'_> {
    fn pixel_size(&self) -> (u32, u32) {
        self.map.size
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let m = self.map;
        let area = root.margin(8, 4, 6, 6);
        let area = draw_titles(&area, &m.title, m.subtitle.as_deref())?;
        let (w, _) = area.dim_in_pixel();
        let (main, bar) = area.split_horizontally(w.saturating_sub(COLOUR_BAR_W));
        let n = self.grid.len();
        let (_, h) = main.dim_in_pixel();
        let rows_px = approx_plot_px(h, 60);
        let every = ((n as f64 * 14.0 / rows_px).ceil() as usize).max(1);
        let centres: Vec<f64> = (0..n).step_by(every).map(|i| (n - i) as f64 - 0.5).collect();
        let names = &self.names;
        let x = &self.x;
        let mut chart = ChartBuilder::on(&main)
            .margin_top(8)
            .margin_bottom(4)
            .margin_left(6)
            .margin_right(16)
            .x_label_area_size(46)
            .y_label_area_size(self.label_w)
            .build_cartesian_2d(Ticked::from(x), Ticked::new(0.0, n as f64, centres, vec![]))
            .map_err(de)?;
        let xf = |v: &f64| x.label(*v);
        let yf = |v: &f64| {
            let i = (n as f64 - *v - 0.5).round();
            if i >= 0.0 && (i as usize) < n {
                names[i as usize].clone()
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .disable_mesh()
            .x_desc("time (µs)")
            .x_label_formatter(&xf)
            .y_label_formatter(&yf)
            .label_style((FAMILY, 12))
            .axis_desc_style((FAMILY, 15))
            .axis_style(BLACK.stroke_width(1))
            .draw()
            .map_err(de)?;

        // Runs of equal colour become one rectangle.
        let mut rects = Vec::new();
        for (i, row) in self.grid.iter().enumerate() {
            let top = (n - i) as f64;
            let bottom = top - 1.0;
            let mut c = 0;
            while c < row.len() {
                let colour = colour_map(row[c]);
                let mut e = c + 1;
                while e < row.len() && colour_map(row[e]) == colour {
                    e += 1;
                }
                let x0 = self.t0 + c as f64 * self.cell_us;
                let x1 = (self.t0 + e as f64 * self.cell_us).min(x.hi);
                let rgb = RGBColor(colour.0, colour.1, colour.2);
                rects.push(Rectangle::new([(x0, bottom), (x1, top)], rgb.filled()));
                c = e;
            }
        }
        chart.draw_series(rects).map_err(de)?;
        // Redraw the frame over the cells.
        chart
            .plotting_area()
            .draw(&Rectangle::new([(x.lo, 0.0), (x.hi, n as f64)], ShapeStyle::from(&BLACK).stroke_width(1)))
            .map_err(de)?;

        draw_colour_bar(&bar, &m.value_label)
    }
}

/// A vertical gradient with 0%, 25%, ..., 100% marks and the value label rotated beside it.
fn draw_colour_bar<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, label: &str) -> Result<(), String> {
    let (_, h) = area.dim_in_pixel();
    let top = 16i32;
    let bottom = (h as i32 - 54).max(top + 20);
    let (x0, x1) = (8i32, 26i32);
    let span = bottom - top;
    for k in 0..span {
        let v = 1.0 - f64::from(k) / f64::from(span.max(1));
        let c = colour_map(v);
        area.draw(&Rectangle::new([(x0, top + k), (x1, top + k + 1)], RGBColor(c.0, c.1, c.2).filled()))
            .map_err(de)?;
    }
    area.draw(&Rectangle::new([(x0, top), (x1, bottom)], ShapeStyle::from(&GRID_BOLD).stroke_width(1)))
        .map_err(de)?;
    let style =
        TextStyle::from((FAMILY, 12).into_font()).color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center));
    for q in 0..=4 {
        let y = bottom - (f64::from(span) * f64::from(q) / 4.0).round() as i32;
        area.draw(&PathElement::new(vec![(x1, y), (x1 + 4, y)], BLACK)).map_err(de)?;
        area.draw_text(&format!("{}%", q * 25), &style, (x1 + 7, y)).map_err(de)?;
    }
    let rotated = TextStyle::from((FAMILY, 14).into_font().transform(FontTransform::Rotate270))
        .color(&BLACK)
        .pos(Pos::new(HPos::Center, VPos::Center));
    area.draw_text(label, &rotated, (x1 + 58, (top + bottom) / 2)).map_err(de)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_map_endpoints_and_no_data() {
        assert_eq!(colour_map(0.0), VIRIDIS[0]);
        assert_eq!(colour_map(1.0), VIRIDIS[8]);
        assert_eq!(colour_map(7.0), VIRIDIS[8]);
        assert_eq!(colour_map(f64::NAN), (NO_DATA.0, NO_DATA.1, NO_DATA.2));
    }

    #[test]
    fn reduce_averages_blocks_and_keeps_missing_as_nan() {
        let tracks = vec![
            HeatTrack { name: "a".into(), values: vec![0.0, 1.0, 0.5, 0.5] },
            HeatTrack { name: "b".into(), values: vec![1.0, 1.0] },
        ];
        let g = reduce(&tracks, 4, 2, 1);
        assert_eq!(g.len(), 2);
        assert_eq!(g[0], vec![0.5, 0.5]);
        assert_eq!(g[1][0], 1.0);
        assert!(g[1][1].is_nan());
        let merged = reduce(&tracks, 4, 4, 2);
        assert_eq!(merged.len(), 1);
        assert!((merged[0][0] - 4.0 / 6.0).abs() < 1e-12);
    }
}
