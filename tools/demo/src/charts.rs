//! The demo's charts: arrivals against deliveries per merchant, and the feedback scenario's levels.

use std::collections::HashMap;

use drip_core::time::Millis;
use plotters::prelude::*;

use crate::*;

/// Blue, orange, green, purple, teal, brown (as `drip simulate --plot` draws keys): apart from
/// each other and from black.
const KEY_COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(23, 190, 207),
    RGBColor(140, 86, 75),
];

pub(crate) type SecondsChart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// The demo's charts: seconds since the burst (0..end) across, 0..top up, on white.
pub(crate) fn seconds_chart<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    caption: &str,
    (end, top): (f64, f64),
) -> anyhow::Result<SecondsChart<'a, 'b>> {
    root.fill(&WHITE)?;
    Ok(ChartBuilder::on(root)
        .caption(caption, ("sans-serif", 20))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(52)
        .build_cartesian_2d(0f64..end, 0f64..top)?)
}

/// The legend at the lower right, and the file written.
pub(crate) fn finish<'a, 'b: 'a>(
    mut chart: SecondsChart<'a, 'b>,
    root: &DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
) -> anyhow::Result<()> {
    legend(&mut chart)?;
    root.present()?;
    Ok(())
}

/// The chart's legend at the lower right, boxed on a pale ground.
fn legend<'a, 'b: 'a>(chart: &mut SecondsChart<'a, 'b>) -> anyhow::Result<()> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.85))
        .draw()?;
    Ok(())
}

/// The feedback scenario: the first merchant's count in force per window (level × limit) over
/// time, its pauses shaded, and when the partner refused.
pub(crate) fn draw_feedback_chart(
    path: &std::path::Path,
    feedback: &Feedback,
    limit: drip_core::rules::Limit,
) -> anyhow::Result<()> {
    let seconds = |t: Millis| t as f64 / 1e3;
    let end = feedback.levels.last().map_or(1.0, |l| seconds(l.0)).max(1.0);
    let top = limit.limit() as f64 * 1.1;
    let root = SVGBackend::new(path, (1100, 360)).into_drawing_area();
    let caption = "The partner's 429s, the pause and the adaptive limit (merchant m001)";
    let mut chart = seconds_chart(&root, caption, (end, top))?;
    chart
        .configure_mesh()
        .x_desc("seconds since the burst was published")
        .y_desc(format!("count in force per {} ms", limit.per()))
        .draw()?;
    chart
        .draw_series([Rectangle::new(
            [(seconds(THROTTLE_FROM), 0.0), (seconds(THROTTLE_UNTIL), top)],
            RED.mix(0.08).filled(),
        )])?
        .label("the partner answers 429, Retry-After: 3")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], RED.mix(0.2).filled()));
    let paused: Vec<f64> = feedback.levels.iter().filter(|l| l.2).map(|l| seconds(l.0)).collect();
    chart
        .draw_series(paused.iter().map(|&t| Rectangle::new([(t - 0.05, 0.0), (t + 0.05, top * 0.05)], BLACK.filled())))?
        .label("the key is paused")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], BLACK.filled()));
    let steps: Vec<(f64, f64)> =
        feedback.levels.iter().map(|&(at, level, _)| (seconds(at), level * limit.limit() as f64)).collect();
    chart
        .draw_series(LineSeries::new(steps, BLUE.stroke_width(2)))?
        .label("the adaptive count in force (level × limit)")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLUE.stroke_width(2)));
    finish(chart, &root)
}

/// One panel per merchant, one above the other on a shared time axis (their curves coincide when
/// drawn together): each merchant's arrivals (faint), deliveries and the limit's line.
pub(crate) fn draw_chart(
    path: &std::path::Path,
    burst: &Burst,
    deliveries: &HashMap<String, Delivery>,
    limit: drip_core::rules::Limit,
) -> anyhow::Result<()> {
    let Burst { merchants, merchant_of, published_at, started } = burst;
    let (started, limit, per) = (*started, limit.limit(), limit.per());
    let seconds = |t: Millis| (t - started) as f64 / 1e3;
    let end = deliveries.values().map(|d| seconds(d.delivered_at)).fold(1.0, f64::max) * 1.05;
    let top = (merchants.iter().map(|m| merchant_of.values().filter(|v| *v == m).count()).max().unwrap_or(1) as f64
        * 1.1)
        .max(1.0);
    let colors = KEY_COLORS;
    let drawn = merchants.len().clamp(1, colors.len());
    let root = SVGBackend::new(path, (1100, 60 + 190 * drawn as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut caption =
        format!("Arrivals vs deliveries, one merchant a panel (limit {limit} per {} s)", per as f64 / 1e3);
    if merchants.len() > drawn {
        caption.push_str(&format!("; {} more merchants not drawn", merchants.len() - drawn));
    }
    let (title, body) = root.split_vertically(44);
    title.titled(&caption, ("sans-serif", 20))?;
    let slope = limit as f64 / (per as f64 / 1e3);
    for (index, (area, merchant)) in body.split_evenly((drawn, 1)).iter().zip(merchants).enumerate() {
        let color = colors[index];
        let mut chart = ChartBuilder::on(area)
            .caption(format!("merchant {merchant}"), ("sans-serif", 15))
            .margin(8)
            .x_label_area_size(if index + 1 == drawn { 36 } else { 18 })
            .y_label_area_size(52)
            .build_cartesian_2d(0f64..end, 0f64..top)?;
        let mut mesh = chart.configure_mesh();
        mesh.y_desc("events").y_labels(4).y_label_formatter(&|v| format!("{v:.0}"));
        if index + 1 == drawn {
            mesh.x_desc("seconds since the burst was published");
        }
        mesh.draw()?;
        let mut arrivals: Vec<f64> = merchant_of
            .iter()
            .filter(|(_, m)| *m == merchant)
            .filter_map(|(id, _)| published_at.get(id))
            .map(|&t| seconds(t))
            .collect();
        arrivals.sort_by(f64::total_cmp);
        let mut delivered: Vec<f64> =
            deliveries.values().filter(|d| &d.merchant == merchant).map(|d| seconds(d.delivered_at)).collect();
        delivered.sort_by(f64::total_cmp);
        let steps = |times: &[f64]| {
            let mut points = vec![(0.0, 0.0)];
            for (n, &t) in times.iter().enumerate() {
                points.push((t, n as f64));
                points.push((t, n as f64 + 1.0));
            }
            points.push((end, times.len() as f64));
            points
        };
        chart
            .draw_series(LineSeries::new(steps(&arrivals), color.mix(0.35).stroke_width(2)))?
            .label("arrived")
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.mix(0.35).stroke_width(2)));
        chart
            .draw_series(LineSeries::new(steps(&delivered), color.stroke_width(2)))?
            .label("delivered")
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
        chart
            .draw_series(LineSeries::new(
                [(0.0, limit as f64), (end, limit as f64 + slope * end)],
                BLACK.mix(0.6).stroke_width(1),
            ))?
            .label(format!("the limit: {limit} at once, then {slope:.0} per second"))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLACK.mix(0.6)));
        legend(&mut chart)?;
    }
    root.present()?;
    Ok(())
}
