//! SVG plots of [`Report`]s, drawn with [`plotters`](https://docs.rs/plotters) into a string.
//!
//! Each function returns the SVG text; writing it to a file is the caller's choice. The output is a pure
//! function of the reports (no fonts are read: text is laid out with fixed glyph widths and rendered by
//! the SVG viewer), so the same reports give byte-identical files.

use super::report::{Report, TimeSeries};
use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use std::fmt;

/// Why a plot could not be drawn (an error of the drawing backend).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlotError(String);

impl fmt::Display for PlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot draw the plot: {}", self.0)
    }
}

impl std::error::Error for PlotError {}

impl<E: std::error::Error + Send + Sync> From<DrawingAreaErrorKind<E>> for PlotError {
    fn from(error: DrawingAreaErrorKind<E>) -> Self {
        PlotError(error.to_string())
    }
}

/// Line colours, one per report, distinguishable in print.
const COLOURS: [RGBColor; 8] = [
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

fn colour(i: usize) -> RGBColor {
    COLOURS[i % COLOURS.len()]
}

const FONT: &str = "sans-serif";

type Metric = fn(&TimeSeries) -> &[f64];

/// One panel of a time-series plot: a [`TimeSeries`] field over time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Panel {
    /// Requests waiting (gate queue and engine queue).
    Waiting,
    /// Sequences running in the engine.
    Running,
    /// KV pool in use, percent.
    KvPercent,
    /// TTFT p90 of each interval, log scale.
    TtftP90,
    /// Good requests per second of each interval.
    Goodput,
    /// The gate's in-flight limit.
    MaxInFlight,
    /// The gate's KV budget, percent of the pool.
    KvBudgetPercent,
}

impl Panel {
    /// The four panels of [`time_series`].
    pub const OVERLOAD: [Panel; 4] = [Panel::Waiting, Panel::Running, Panel::KvPercent, Panel::TtftP90];

    fn caption(self) -> &'static str {
        match self {
            Panel::Waiting => "requests waiting (gate queue + engine queue)",
            Panel::Running => "sequences running in the engine",
            Panel::KvPercent => "KV pool in use (%)",
            Panel::TtftP90 => "TTFT p90 of each interval (s, log scale)",
            Panel::Goodput => "good requests per second (each interval)",
            Panel::MaxInFlight => "the gate's in-flight limit (max_in_flight)",
            Panel::KvBudgetPercent => "the gate's KV budget (% of the engine's pool)",
        }
    }

    fn metric(self) -> Metric {
        match self {
            Panel::Waiting => |s| &s.waiting,
            Panel::Running => |s| &s.running,
            Panel::KvPercent => |s| &s.kv_percent,
            Panel::TtftP90 => |s| &s.ttft_p90,
            Panel::Goodput => |s| &s.goodput,
            Panel::MaxInFlight => |s| &s.max_in_flight,
            Panel::KvBudgetPercent => |s| &s.kv_budget_percent,
        }
    }

    fn log(self) -> bool {
        self == Panel::TtftP90
    }
}

/// Four stacked panels over time, one line per report (labelled with its gate): requests waiting (gate
/// queue and engine queue), sequences running, KV pool in use, and the p90 TTFT of the first tokens of
/// each interval (log scale). The same as [`panels`] with [`Panel::OVERLOAD`].
///
/// # Errors
///
/// [`PlotError`] if the backend fails.
pub fn time_series(reports: &[Report], title: &str) -> Result<String, PlotError> {
    panels(reports, title, &Panel::OVERLOAD)
}

/// Stacked panels over time, one per entry of `panels` (300 pixels high each), one line per report
/// (labelled with its gate).
///
/// # Errors
///
/// [`PlotError`] if the backend fails.
pub fn panels(reports: &[Report], title: &str, panels: &[Panel]) -> Result<String, PlotError> {
    let mut svg = String::new();
    {
        let height = 300 * panels.len().max(1) as u32;
        let root = SVGBackend::with_string(&mut svg, (1000, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.titled(title, (FONT, 22))?;
        let areas = root.split_evenly((panels.len().max(1), 1));
        for (area, panel) in areas.iter().zip(panels) {
            series_panel(area, reports, panel.caption(), panel.metric(), panel.log())?;
        }
        root.present()?;
    }
    Ok(svg)
}

fn series_panel(
    panel: &DrawingArea<SVGBackend<'_>, Shift>,
    reports: &[Report],
    name: &str,
    metric: Metric,
    log: bool,
) -> Result<(), PlotError> {
    let x_max = reports.iter().filter_map(|r| r.series.t.last().copied()).fold(1.0, f64::max);
    let values = || reports.iter().flat_map(|r| metric(&r.series).iter().copied()).filter(|v| v.is_finite());
    let y_max = values().fold(0.0, f64::max).max(1.0) * 1.08;
    let mut builder = ChartBuilder::on(panel);
    builder.margin(8).caption(name, (FONT, 16)).x_label_area_size(28).y_label_area_size(60);
    let lines = |r: &Report| -> Vec<(f64, f64)> {
        r.series.t.iter().zip(metric(&r.series)).map(|(&t, &v)| (t, v)).filter(|(_, v)| v.is_finite()).collect()
    };
    if log {
        let y_min = values().filter(|&v| v > 0.0).fold(f64::INFINITY, f64::min).clamp(1e-3, 0.1);
        let mut chart = builder.build_cartesian_2d(0.0..x_max, (y_min..y_max).log_scale())?;
        chart.configure_mesh().x_desc("time (s)").light_line_style(WHITE).draw()?;
        for (i, report) in reports.iter().enumerate() {
            let points: Vec<(f64, f64)> = lines(report).into_iter().filter(|&(_, v)| v > 0.0).collect();
            draw_line(&mut chart, points, i, &report.gate)?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)
    } else {
        let mut chart = builder.build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
        chart.configure_mesh().x_desc("time (s)").light_line_style(WHITE).draw()?;
        for (i, report) in reports.iter().enumerate() {
            draw_line(&mut chart, lines(report), i, &report.gate)?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)
    }
}

fn draw_line<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    points: Vec<(f64, f64)>,
    i: usize,
    label: &str,
) -> Result<(), PlotError>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let style = colour(i).stroke_width(2);
    chart
        .draw_series(LineSeries::new(points, style))?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    Ok(())
}

fn legend<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    position: SeriesLabelPosition,
) -> Result<(), PlotError>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font((FONT, 13))
        .draw()?;
    Ok(())
}

/// The cumulative distribution of the time to first token of completed requests, one curve per report
/// (labelled with its gate), TTFT on a log scale. `slo` (seconds) is drawn as a vertical line.
///
/// # Errors
///
/// [`PlotError`] if the backend fails.
pub fn ttft_cdf(reports: &[Report], title: &str, slo: f64) -> Result<String, PlotError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 560)).into_drawing_area();
        root.fill(&WHITE)?;
        let x_min = reports.iter().filter_map(|r| r.ttft_sorted.first().copied()).fold(0.1, f64::min).max(1e-3);
        let x_max = reports.iter().filter_map(|r| r.ttft_sorted.last().copied()).fold(slo * 2.0, f64::max) * 1.2;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .caption(title, (FONT, 20))
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d((x_min..x_max).log_scale(), 0.0..1.0)?;
        chart
            .configure_mesh()
            .x_desc("time to first token of completed requests (s, log scale)")
            .y_desc("share of completed requests")
            .light_line_style(WHITE)
            .draw()?;
        chart.draw_series(LineSeries::new(vec![(slo, 0.0), (slo, 1.0)], BLACK.mix(0.5).stroke_width(1)))?;
        for (i, report) in reports.iter().enumerate() {
            let n = report.ttft_sorted.len();
            // At most ~2000 points per curve: every k-th order statistic, and the last.
            let step = (n / 2000).max(1);
            let points: Vec<(f64, f64)> = (0..n)
                .step_by(step)
                .chain((n > 0).then_some(n - 1))
                .map(|k| (report.ttft_sorted[k].max(x_min), (k + 1) as f64 / n as f64))
                .collect();
            draw_line(&mut chart, points, i, &report.gate)?;
        }
        legend(&mut chart, SeriesLabelPosition::LowerRight)?;
        root.present()?;
    }
    Ok(svg)
}

/// Bars of tries per request (retry amplification), one per report, labelled with its client retry
/// policy, with the shares of finished requests that needed 1, 2, 3–5 and 6 or more tries written
/// above each bar.
///
/// # Errors
///
/// [`PlotError`] if the backend fails.
pub fn tries_per_request(reports: &[Report], title: &str) -> Result<String, PlotError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 520)).into_drawing_area();
        root.fill(&WHITE)?;
        let n = reports.len().max(1);
        let y_max = reports.iter().map(|r| r.tries_per_request).fold(1.0, f64::max) * 1.25;
        let names: Vec<String> = reports.iter().map(|r| r.retry.clone()).collect();
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .caption(title, (FONT, 20))
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(-0.5..(n as f64 - 0.2), 0.0..y_max)?;
        category_mesh(&mut chart, &names, "tries per request (mean)")?;
        for (i, report) in reports.iter().enumerate() {
            let x = i as f64;
            let bar = Rectangle::new([(x - 0.3, 0.0), (x + 0.3, report.tries_per_request)], colour(i).filled());
            chart.draw_series(std::iter::once(bar))?;
            let finished: u64 = report.tries_histogram.iter().sum();
            let share = |range: std::ops::Range<usize>| {
                let k: u64 = report.tries_histogram.iter().skip(range.start).take(range.len()).sum();
                100.0 * k as f64 / finished.max(1) as f64
            };
            let text = format!(
                "{:.2}: 1 try {:.0}%, 2: {:.0}%, 3-5: {:.0}%, 6+: {:.0}%",
                report.tries_per_request,
                share(0..1),
                share(1..2),
                share(2..5),
                share(5..usize::MAX)
            );
            let label_y = report.tries_per_request + y_max * 0.03;
            chart.draw_series(std::iter::once(Text::new(
                text,
                (x - 0.42, label_y),
                (FONT, 12).into_font().color(&BLACK),
            )))?;
        }
        root.present()?;
    }
    Ok(svg)
}

/// Grouped bars of the tokens each of `tenants` was served, one group per entry of `groups` (a label and
/// its report), one bar per tenant (coloured by its place in `tenants`, named in the legend), in millions
/// of tokens — each prompt token counted `weights.0` times and each output token `weights.1` times, as
/// [`Fairness::Tokens`](crate::Fairness::Tokens) counts them. The value is written above each bar.
///
/// # Errors
///
/// [`PlotError`] if the backend fails.
pub fn served_tokens(
    groups: &[(String, &Report)],
    tenants: &[(u64, &str)],
    weights: (u32, u32),
    title: &str,
) -> Result<String, PlotError> {
    let served = |report: &Report, tenant: u64| {
        let t = report.tenants.iter().find(|t| t.tenant == tenant).copied().unwrap_or_default();
        t.served(weights.0, weights.1) as f64 / 1e6
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 520)).into_drawing_area();
        root.fill(&WHITE)?;
        let n = groups.len().max(1);
        let y_max = groups
            .iter()
            .flat_map(|(_, report)| tenants.iter().map(|&(tenant, _)| served(report, tenant)))
            .fold(1e-3, f64::max)
            * 1.2;
        let names: Vec<String> = groups.iter().map(|(label, _)| label.clone()).collect();
        let y_desc = format!("tokens served (M; prompt x{}, output x{})", weights.0, weights.1);
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .caption(title, (FONT, 20))
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(-0.5..(n as f64 - 0.5), 0.0..y_max)?;
        category_mesh(&mut chart, &names, &y_desc)?;
        let width = 0.8 / tenants.len().max(1) as f64;
        for (k, &(tenant, name)) in tenants.iter().enumerate() {
            let bars: Vec<(f64, f64)> = groups
                .iter()
                .enumerate()
                .map(|(i, (_, report))| (i as f64 - 0.4 + width * k as f64, served(report, tenant)))
                .collect();
            let style = colour(k).filled();
            chart
                .draw_series(
                    bars.iter().map(|&(x, y)| Rectangle::new([(x + 0.02, 0.0), (x + width - 0.02, y)], style)),
                )?
                .label(name)
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], style));
            chart.draw_series(bars.iter().map(|&(x, y)| {
                Text::new(format!("{y:.2}"), (x + 0.03, y + y_max * 0.02), (FONT, 12).into_font().color(&BLACK))
            }))?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)?;
        root.present()?;
    }
    Ok(svg)
}

/// The mesh of a bar chart: one category per whole x from 0, named by `names` on the axis.
fn category_mesh<'a>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    names: &[String],
    y_desc: &str,
) -> Result<(), PlotError> {
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(names.len().max(1))
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                names.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc(y_desc)
        .light_line_style(WHITE)
        .draw()?;
    Ok(())
}
