//! Part 9's plots (plotters, SVG): the curves of each mode, one panel per measure.

use std::path::Path;

use anyhow::Result;

use super::scale::{Mode, Point};
#[cfg(feature = "plots")]
use super::{report::median, scale::Reader};

/// Without xtask's `plots` feature (the light build `cargo xtask` makes for the demo) there is
/// no plotting; `cargo xtask bench` re-runs itself with the feature before it gets here.
#[cfg(not(feature = "plots"))]
pub fn plot(_points: &[Point], _root: &Path) -> Result<Vec<(Mode, String)>> {
    anyhow::bail!(
        "the scale plots need xtask's `plots` feature (cargo run -p xtask --features plots)"
    )
}

/// One SVG per mode: CPU, read latency, freshness and RSS against Services (log scale), the
/// change-driven reader beside the timer baseline. Returns each mode's path relative to `root`.
#[cfg(feature = "plots")]
pub fn plot(points: &[Point], root: &Path) -> Result<Vec<(Mode, String)>> {
    use plotters::prelude::*;
    let dir = root.join("benchmarks");
    std::fs::create_dir_all(&dir)?;
    let mut out = Vec::new();
    for mode in [Mode::Iptables, Mode::Nftables, Mode::Ipvs] {
        let ps: Vec<&Point> = points.iter().filter(|p| p.mode == mode).collect();
        if ps.is_empty() {
            continue;
        }
        let rel = format!("benchmarks/scale-{}.svg", mode.name());
        let path = root.join(&rel);
        let area = SVGBackend::new(&path, (1100, 800)).into_drawing_area();
        area.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let area = area
            .titled(
                &format!("Service table at scale, kube-proxy {} mode", mode.name()),
                ("sans-serif", 22),
            )
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let panels = area.split_evenly((2, 2));
        let xmax = ps.iter().map(|p| p.services).max().unwrap_or(100) as f64 * 1.5;
        let xmin = ps.iter().map(|p| p.services).min().unwrap_or(100) as f64 / 1.5;
        type Series = (&'static str, Reader, fn(&Point) -> f64);
        // One measure's curve for each reader.
        let by_reader = |measure: fn(&Point) -> f64| -> Vec<Series> {
            vec![
                ("on change", Reader::Change, measure),
                ("on change, with the API", Reader::Api, measure),
                ("timer (old)", Reader::Timer, measure),
            ]
        };
        let panels_spec: [(&str, Vec<Series>); 4] = [
            (
                "CPU, % of one core",
                vec![
                    ("idle, on change", Reader::Change, |p| p.cpu[0]),
                    ("re-sync unchanged, on change", Reader::Change, |p| p.cpu[1]),
                    ("re-sync 1 changed, on change", Reader::Change, |p| p.cpu[2]),
                    ("partial sync 1 changed, on change", Reader::Change, |p| {
                        p.cpu[3]
                    }),
                    ("idle, timer (old)", Reader::Timer, |p| p.cpu[0]),
                    ("re-sync unchanged, timer (old)", Reader::Timer, |p| {
                        p.cpu[1]
                    }),
                ],
            ),
            (
                "read latency, ms (median)",
                by_reader(|p| median(&p.read_ms)),
            ),
            ("freshness, ms (median)", by_reader(|p| median(&p.fresh_ms))),
            ("RSS peak, MiB", by_reader(|p| p.rss_mib)),
        ];
        let colors = [BLUE, RED, GREEN, CYAN, MAGENTA, BLACK];
        for (panel, (caption, series)) in panels.iter().zip(panels_spec) {
            let ymax = series
                .iter()
                .flat_map(|(_, r, f)| ps.iter().filter(|p| p.reader == *r).map(|p| f(p)))
                .filter(|v| v.is_finite())
                .fold(1.0f64, f64::max)
                * 1.15;
            let mut chart = ChartBuilder::on(panel)
                .caption(caption, ("sans-serif", 16))
                .margin(10)
                .x_label_area_size(35)
                .y_label_area_size(55)
                .build_cartesian_2d((xmin..xmax).log_scale(), 0f64..ymax)
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            chart
                .configure_mesh()
                .x_desc("Services")
                .x_label_formatter(&|x| format!("{x:.0}"))
                .draw()
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            for (i, (label, reader, f)) in series.iter().enumerate() {
                let color = colors[i % colors.len()];
                let data: Vec<(f64, f64)> = ps
                    .iter()
                    .filter(|p| p.reader == *reader)
                    .map(|p| (p.services as f64, f(p)))
                    .filter(|(_, y)| y.is_finite())
                    .collect();
                chart
                    .draw_series(LineSeries::new(data.clone(), color.stroke_width(2)))
                    .map_err(|e| anyhow::anyhow!("{e:?}"))?
                    .label(*label)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                    });
                chart
                    .draw_series(
                        data.iter()
                            .map(|&(x, y)| Circle::new((x, y), 3, color.filled())),
                    )
                    .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        }
        area.present().map_err(|e| anyhow::anyhow!("{e:?}"))?;
        out.push((mode, rel));
    }
    Ok(out)
}
