//! Scatter charts with their Pareto frontier: every point of one or more named sets (for
//! `plan`: each parallelism plan timed, memory per GPU against throughput, one set per
//! fabric), and for each set the points that no other point of the set beats on both axes
//! (less x and more y), joined by a line and drawn larger. PNG and SVG with the embedded
//! font, like every chart of [`crate::report::plot`]. Generic: it knows nothing of plans.

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::report::plot::{
    assign_colours, check_common, de, draw_titles, render_files, Figure, PlotError, FAMILY,
};

/// One named set of `(x, y)` points.
#[derive(Debug, Clone, PartialEq)]
pub struct PointSet {
    /// Legend text; also decides the colour.
    pub name: String,
    /// The points; non-finite ones are dropped.
    pub points: Vec<(f64, f64)>,
}

/// A scatter chart with each set's frontier (smaller x and larger y are better).
#[derive(Debug, Clone, PartialEq)]
pub struct FrontierChart {
    /// Title at the top.
    pub title: String,
    /// Smaller line under the title.
    pub subtitle: Option<String>,
    /// X axis description.
    pub x_label: String,
    /// Y axis description.
    pub y_label: String,
    /// The sets.
    pub sets: Vec<PointSet>,
    /// A vertical reference line and its label (e.g. the HBM capacity).
    pub x_limit: Option<(f64, String)>,
    /// Width and height in pixels.
    pub size: (u32, u32),
}

/// Indices of the Pareto frontier of `points` (no other point has x <= and y >= with one of
/// them strict), in increasing x. Non-finite points are never on it.
pub fn pareto_frontier(points: &[(f64, f64)]) -> Vec<usize> {
    let mut idx: Vec<usize> =
        (0..points.len()).filter(|&i| points[i].0.is_finite() && points[i].1.is_finite()).collect();
    // By x ascending, then y descending: a point is on the frontier when its y beats every
    // y before it.
    idx.sort_by(|&a, &b| {
        points[a].0.total_cmp(&points[b].0).then(points[b].1.total_cmp(&points[a].1)).then(a.cmp(&b))
    });
    let mut out = Vec::new();
    let mut best = f64::NEG_INFINITY;
    for i in idx {
        if points[i].1 > best {
            best = points[i].1;
            out.push(i);
        }
    }
    out
}

impl FrontierChart {
    /// A chart of the default size (900x560).
    pub fn new(
        title: impl Into<String>,
        x_label: impl Into<String>,
        y_label: impl Into<String>,
        sets: Vec<PointSet>,
    ) -> FrontierChart {
        FrontierChart {
            title: title.into(),
            subtitle: None,
            x_label: x_label.into(),
            y_label: y_label.into(),
            sets,
            x_limit: None,
            size: (900, 560),
        }
    }

    /// Renders `out_dir/stem.png` and `out_dir/stem.svg` (creating `out_dir`).
    pub fn render(&self, out_dir: &Path, stem: &str) -> Result<Vec<PathBuf>, PlotError> {
        check_common(&self.title, self.size, stem)?;
        if !self.sets.iter().any(|s| s.points.iter().any(|p| p.0.is_finite() && p.1.is_finite())) {
            return Err(PlotError::NoData { chart: self.title.clone(), reason: "no finite point".into() });
        }
        render_files(self, out_dir, stem)
    }
}

impl Figure for FrontierChart {
    fn pixel_size(&self) -> (u32, u32) {
        self.size
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let area = draw_titles(root, &self.title, self.subtitle.as_deref())?;
        let finite = |p: &&(f64, f64)| p.0.is_finite() && p.1.is_finite();
        let all: Vec<(f64, f64)> =
            self.sets.iter().flat_map(|s| s.points.iter().filter(finite).copied()).collect();
        let mut x_hi = all.iter().map(|p| p.0).fold(0.0f64, f64::max);
        if let Some((x, _)) = &self.x_limit {
            x_hi = x_hi.max(*x);
        }
        let y_hi = all.iter().map(|p| p.1).fold(0.0f64, f64::max);
        let (x_hi, y_hi) = ((x_hi * 1.05).max(1e-9), (y_hi * 1.08).max(1e-9));
        let mut chart = ChartBuilder::on(&area)
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(78)
            .build_cartesian_2d(0.0..x_hi, 0.0..y_hi)
            .map_err(de)?;
        chart
            .configure_mesh()
            .x_desc(self.x_label.as_str())
            .y_desc(self.y_label.as_str())
            .label_style((FAMILY, 13))
            .axis_desc_style((FAMILY, 15))
            .light_line_style(RGBColor(240, 240, 240))
            .bold_line_style(RGBColor(215, 215, 215))
            .y_label_formatter(&|v| short_number(*v))
            .draw()
            .map_err(de)?;
        if let Some((x, label)) = &self.x_limit {
            let grey = RGBColor(120, 120, 120);
            chart
                .draw_series(LineSeries::new([(*x, 0.0), (*x, y_hi)], grey.stroke_width(1)))
                .map_err(de)?
                .label(label.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], grey));
        }
        let names: Vec<&str> = self.sets.iter().map(|s| s.name.as_str()).collect();
        let colours = assign_colours(&names);
        for (s, colour) in self.sets.iter().zip(colours) {
            let pts: Vec<(f64, f64)> = s.points.iter().filter(finite).copied().collect();
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 2, colour.mix(0.35).filled())))
                .map_err(de)?;
            let front: Vec<(f64, f64)> = pareto_frontier(&pts).into_iter().map(|i| pts[i]).collect();
            chart
                .draw_series(LineSeries::new(front.iter().copied(), colour.stroke_width(2)))
                .map_err(de)?
                .label(format!("{} (frontier)", s.name))
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2)));
            chart.draw_series(front.iter().map(|&p| Circle::new(p, 4, colour.filled()))).map_err(de)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .label_font((FAMILY, 13))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(200, 200, 200))
            .draw()
            .map_err(de)?;
        Ok(())
    }
}

/// 1234567 as "1.23M", 45000 as "45k".
fn short_number(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.3}", v / 1e9).trim_end_matches('0').trim_end_matches('.').to_string() + "G"
    } else if a >= 1e6 {
        format!("{:.3}", v / 1e6).trim_end_matches('0').trim_end_matches('.').to_string() + "M"
    } else if a >= 1e3 {
        format!("{:.3}", v / 1e3).trim_end_matches('0').trim_end_matches('.').to_string() + "k"
    } else {
        format!("{v:.3}").trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frontier_keeps_only_undominated_points() {
        let p = [(1.0, 10.0), (2.0, 5.0), (2.0, 20.0), (3.0, 20.0), (4.0, 30.0), (f64::NAN, 99.0)];
        assert_eq!(pareto_frontier(&p), vec![0, 2, 4]);
        assert_eq!(short_number(1_234_000.0), "1.234M");
        assert_eq!(short_number(45_000.0), "45k");
    }
}
