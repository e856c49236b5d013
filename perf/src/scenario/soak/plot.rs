//! The soak run over time: one SVG with three panels (RSS per process, open fds per process,
//! p99 per workload and window), minutes on the x axis and the end of the warm-up marked.

use std::path::Path;

use anyhow::anyhow;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::summary::Sample;

/// One line: a name and (minutes, value) points.
type Series = (String, Vec<(f64, f64)>);

fn panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    title: &str,
    y_label: &str,
    series: &[Series],
    warm_up_min: f64,
) -> anyhow::Result<()> {
    let plot_error = |error: &dyn std::fmt::Display| anyhow!("soak plot {title}: {error}");
    let points = series.iter().flat_map(|(_, points)| points.iter());
    let x_max = points.clone().map(|p| p.0).fold(0.1, f64::max);
    let y_max = points.map(|p| p.1).fold(0.0, f64::max).max(1.0) * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(65)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(|e| plot_error(&e))?;
    chart
        .configure_mesh()
        .x_desc("minutes")
        .y_desc(y_label)
        .draw()
        .map_err(|e| plot_error(&e))?;
    chart
        .draw_series(LineSeries::new(
            [(warm_up_min, 0.0), (warm_up_min, y_max)],
            BLACK.mix(0.4).stroke_width(1),
        ))
        .map_err(|e| plot_error(&e))?
        .label("end of warm-up")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.4)));
    for (index, (name, points)) in series.iter().enumerate() {
        let color = Palette99::pick(index).to_rgba();
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| plot_error(&e))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| plot_error(&e))?;
    Ok(())
}

fn per_process(
    samples: &[Sample],
    value: fn(&super::summary::ProcessSample) -> f64,
) -> Vec<Series> {
    let names: Vec<String> = samples
        .first()
        .map(|s| s.processes.iter().map(|p| p.name.clone()).collect())
        .unwrap_or_default();
    names
        .into_iter()
        .map(|name| {
            let points = samples
                .iter()
                .filter_map(|s| {
                    let process = s.processes.iter().find(|p| p.name == name)?;
                    Some((s.elapsed_s / 60.0, value(process)))
                })
                .collect();
            (name, points)
        })
        .collect()
}

/// Writes the three panels to `path`.
pub fn over_time(path: &Path, samples: &[Sample], warm_up_min: f64) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (900, 1100)).into_drawing_area();
    root.fill(&WHITE)
        .map_err(|e| anyhow!("plot {}: {e}", path.display()))?;
    let panels = root.split_evenly((3, 1));
    let rss = per_process(samples, |p| p.rss_kib as f64 / 1024.0);
    panel(
        &panels[0],
        "RSS per process",
        "RSS (MiB)",
        &rss,
        warm_up_min,
    )?;
    let fds = per_process(samples, |p| p.fds as f64);
    panel(
        &panels[1],
        "Open file descriptors per process",
        "fds",
        &fds,
        warm_up_min,
    )?;
    let p99 = |name: &str, pick: fn(&Sample) -> Option<u64>| -> Series {
        let points = samples
            .iter()
            .filter_map(|s| Some((s.elapsed_s / 60.0, pick(s)? as f64 / 1000.0)))
            .collect();
        (name.to_string(), points)
    };
    let latency = [
        p99("tunnel p99", |s| s.tunnel.p99_us),
        p99("gateway p99", |s| s.gateway.p99_us),
    ];
    panel(
        &panels[2],
        "p99 latency per window",
        "p99 (ms)",
        &latency,
        warm_up_min,
    )?;
    root.present()
        .map_err(|e| anyhow!("plot {}: {e}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::summary::{ProcessSample, WindowLoad};
    use super::*;

    #[test]
    fn draws_every_process_and_workload() {
        let sample = |window: u32| Sample {
            window,
            elapsed_s: f64::from(window) * 30.0,
            processes: vec![ProcessSample {
                name: "sluice".into(),
                pid: 1,
                rss_kib: 20_000 + u64::from(window),
                fds: 40,
            }],
            tunnel: WindowLoad {
                p99_us: Some(900),
                ..WindowLoad::default()
            },
            gateway: WindowLoad::default(),
            connected_tunnels: 0,
            churn: None,
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("soak.svg");
        over_time(&path, &[sample(1), sample(2), sample(3)], 0.5).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("sluice") && svg.contains("tunnel p99"));
        over_time(&dir.path().join("empty.svg"), &[], 0.0).unwrap();
    }
}
