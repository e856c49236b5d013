//! SVG line charts (plotters) of a metric by concurrency, one line per case.

use std::path::Path;

use anyhow::anyhow;
use plotters::prelude::*;

/// One line: a case name and (concurrency, value) points.
pub type Series = (String, Vec<(f64, f64)>);

/// Draws `series` with a logarithmic concurrency axis.
pub fn by_concurrency(
    path: &Path,
    title: &str,
    y_label: &str,
    series: &[Series],
) -> anyhow::Result<()> {
    let points = series.iter().flat_map(|(_, points)| points.iter());
    let x_max = points.clone().map(|p| p.0).fold(1.0, f64::max) * 1.5;
    let y_max = points.map(|p| p.1).fold(0.0, f64::max).max(1.0) * 1.1;
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    let plot_error = |error: &dyn std::fmt::Display| anyhow!("plot {}: {error}", path.display());
    root.fill(&WHITE).map_err(|e| plot_error(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((0.8f64..x_max).log_scale(), 0f64..y_max)
        .map_err(|e| plot_error(&e))?;
    chart
        .configure_mesh()
        .x_desc("concurrent requests (clients x streams)")
        .y_desc(y_label)
        .draw()
        .map_err(|e| plot_error(&e))?;
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
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(|e| plot_error(&e))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| plot_error(&e))?;
    root.present().map_err(|e| plot_error(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_an_svg_with_every_case() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("throughput.svg");
        let series = vec![
            ("direct".to_string(), vec![(1.0, 100.0), (10.0, 900.0)]),
            ("sluice".to_string(), vec![(1.0, 50.0), (10.0, 300.0)]),
        ];
        by_concurrency(&path, "throughput", "req/s", &series).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("direct") && svg.contains("sluice"));
    }

    #[test]
    fn empty_series_still_draw() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty.svg");
        by_concurrency(&path, "nothing", "req/s", &[]).unwrap();
        assert!(path.exists());
    }
}
