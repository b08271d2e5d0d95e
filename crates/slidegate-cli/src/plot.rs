//! SVG charts for `demo --plot`, `accuracy --plot` and `replay --svg`, written by hand.
//!
//! Three chart kinds are all the commands need — cumulative admissions as step
//! lines, grouped bars, and counts over time — so a few dozen lines of SVG text serve better
//! than a plotting crate (no fonts, no extra build time on small machines).

use std::fmt::Write as _;
use std::io;
use std::path::Path;

const WIDTH: f64 = 820.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 250.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
/// Distinct on white and for the common colour-vision deficiencies (Okabe–Ito).
const COLOURS: [&str; 8] =
    ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"];

/// Writes the boundary-burst chart: for each series (an algorithm), permits
/// admitted so far against time, with the window boundary marked.
///
/// `series` holds `(name, points)`; each point is `(t, admitted)`: `t` in ms
/// on a time line whose multiples of `window_ms` are window boundaries (e.g.
/// 0 = the start of the window before the boundary), `admitted` the permits
/// admitted up to and including `t`. A dashed line marks each boundary inside
/// the plotted span; the legend gives each series' final count.
pub fn boundary_burst_svg(path: &Path, window_ms: u64, series: &[(&str, Vec<(u64, u64)>)]) -> io::Result<()> {
    let t_max = series.iter().flat_map(|(_, p)| p.iter().map(|&(t, _)| t)).max().unwrap_or(0).max(1);
    let t_min = series.iter().flat_map(|(_, p)| p.iter().map(|&(t, _)| t)).min().unwrap_or(0).min(t_max - 1);
    let y_max = series.iter().flat_map(|(_, p)| p.iter().map(|&(_, n)| n)).max().unwrap_or(0).max(1);
    let mut svg = Svg::new("Admitted requests around a window boundary");
    let x = Axis::new(t_min as f64, t_max as f64, LEFT, WIDTH - RIGHT);
    let y = Axis::new(0.0, y_max as f64, HEIGHT - BOTTOM, TOP);
    svg.axes(&x, &y, "time (ms)", "admitted so far");
    // Boundaries strictly inside the axis: one at either end is the frame.
    let (lo, hi) = (x.min as u64, x.max as u64);
    if let Some(first) = lo.checked_div(window_ms) {
        let mut boundary = (first + 1) * window_ms;
        while boundary < hi {
            let bx = x.at(boundary as f64);
            let _ = write!(
                svg.body,
                r##"<line x1="{bx:.1}" y1="{TOP}" x2="{bx:.1}" y2="{:.1}" stroke="#888" stroke-dasharray="4 3"/><text x="{:.1}" y="{:.1}" font-size="11" fill="#555">window boundary</text>"##,
                HEIGHT - BOTTOM,
                bx + 4.0,
                TOP + 12.0
            );
            boundary += window_ms;
        }
    }
    for (i, (name, points)) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let mut d = String::new();
        let mut last: Option<(f64, f64)> = None;
        for &(t, n) in points {
            let (px, py) = (x.at(t as f64), y.at(n as f64));
            match last {
                None => {
                    let _ = write!(d, "M{px:.1},{py:.1}");
                }
                // A step: the count holds until the next admission.
                Some((_, ly)) => {
                    let _ = write!(d, " L{px:.1},{ly:.1} L{px:.1},{py:.1}");
                }
            }
            last = Some((px, py));
        }
        // Earlier series wider: where curves coincide, each stays visible as a band.
        let width = 1.5 + 1.5 * (series.len() - 1 - i) as f64;
        let _ = write!(svg.body, r#"<path d="{d}" fill="none" stroke="{colour}" stroke-width="{width}"/>"#);
        let total = points.last().map_or(0, |&(_, n)| n);
        svg.legend(i, colour, &format!("{name}: {total}"));
    }
    svg.write(path)
}

/// Writes a grouped bar chart: one group per category, one bar per series.
///
/// `series` holds `(name, values)` with one value per category, in order.
pub fn grouped_bars_svg(
    path: &Path,
    title: &str,
    y_label: &str,
    categories: &[&str],
    series: &[(&str, Vec<f64>)],
) -> io::Result<()> {
    let y_max = series.iter().flat_map(|(_, v)| v.iter().copied()).fold(0.0_f64, f64::max);
    let mut svg = Svg::new(title);
    let groups = categories.len().max(1) as f64;
    let x = Axis { min: 0.0, max: groups, step: 1.0, from: LEFT, to: WIDTH - RIGHT };
    let y = Axis::new(0.0, y_max, HEIGHT - BOTTOM, TOP);
    svg.y_axis(&y, y_label);
    let group = x.at(1.0) - x.at(0.0);
    let bar = group * 0.8 / series.len().max(1) as f64;
    for (c, category) in categories.iter().enumerate() {
        let _ = write!(
            svg.body,
            r#"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle">{}</text>"#,
            x.at(c as f64 + 0.5),
            HEIGHT - BOTTOM + 18.0,
            escape(category)
        );
        for (s, (_, values)) in series.iter().enumerate() {
            let v = values.get(c).copied().unwrap_or(0.0);
            let (bx, top) = (x.at(c as f64) + group * 0.1 + bar * s as f64, y.at(v));
            let _ = write!(
                svg.body,
                r#"<rect x="{bx:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}: {v}</title></rect>"#,
                (bar - 1.0).max(1.0),
                (HEIGHT - BOTTOM - top).max(0.0),
                COLOURS[s % COLOURS.len()],
                escape(series[s].0)
            );
        }
    }
    let _ = write!(
        svg.body,
        r##"<line x1="{LEFT}" y1="{b:.1}" x2="{:.1}" y2="{b:.1}" stroke="#000"/>"##,
        WIDTH - RIGHT,
        b = HEIGHT - BOTTOM
    );
    for (s, (name, _)) in series.iter().enumerate() {
        svg.legend(s, COLOURS[s % COLOURS.len()], name);
    }
    svg.write(path)
}

/// Writes a line chart of counts over time: one line per series, point `i`
/// of each at `i × step` on the x axis (a bucket's start, in the unit the
/// label names). The legend gives each series' total.
pub fn counts_over_time_svg(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    step: f64,
    series: &[(&str, Vec<u64>)],
) -> io::Result<()> {
    let points = series.iter().map(|(_, v)| v.len()).max().unwrap_or(0);
    let y_max = series.iter().flat_map(|(_, v)| v.iter().copied()).max().unwrap_or(0).max(1);
    let mut svg = Svg::new(title);
    let x = Axis::new(0.0, (points.saturating_sub(1) as f64 * step).max(step), LEFT, WIDTH - RIGHT);
    let y = Axis::new(0.0, y_max as f64, HEIGHT - BOTTOM, TOP);
    svg.axes(&x, &y, x_label, y_label);
    for (i, (name, values)) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let mut d = String::new();
        for (j, &n) in values.iter().enumerate() {
            let (px, py) = (x.at(j as f64 * step), y.at(n as f64));
            let _ = write!(d, "{}{px:.1},{py:.1}", if j == 0 { "M" } else { " L" });
        }
        let _ = write!(svg.body, r#"<path d="{d}" fill="none" stroke="{colour}" stroke-width="2"/>"#);
        svg.legend(i, colour, &format!("{name}: {}", values.iter().sum::<u64>()));
    }
    svg.write(path)
}

/// A linear map from data values to SVG coordinates.
struct Axis {
    min: f64,
    max: f64,
    step: f64,
    from: f64,
    to: f64,
}

impl Axis {
    /// An axis covering `min..=max`, widened to whole multiples of a round step.
    fn new(min: f64, max: f64, from: f64, to: f64) -> Self {
        let max = if max > min { max } else { min + 1.0 };
        let step = nice_ceiling((max - min) / 5.0);
        let (min, max) = ((min / step).floor() * step, (max / step).ceil() * step);
        Self { min, max, step, from, to }
    }

    fn at(&self, v: f64) -> f64 {
        self.from + (v - self.min) / (self.max - self.min) * (self.to - self.from)
    }

    /// Tick values at every step, ends included.
    fn ticks(&self) -> impl Iterator<Item = f64> + '_ {
        let n = ((self.max - self.min) / self.step).round() as u32;
        (0..=n).map(move |i| self.min + self.step * f64::from(i))
    }
}

struct Svg {
    body: String,
}

impl Svg {
    fn new(title: &str) -> Self {
        let mut body = String::new();
        let _ = write!(
            body,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif"><rect width="100%" height="100%" fill="white"/><text x="{:.1}" y="22" font-size="15" text-anchor="middle">{}</text>"#,
            WIDTH / 2.0,
            escape(title)
        );
        Self { body }
    }

    fn y_axis(&mut self, y: &Axis, label: &str) {
        for v in y.ticks() {
            let py = y.at(v);
            let _ = write!(
                self.body,
                r##"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
                WIDTH - RIGHT,
                LEFT - 6.0,
                py + 4.0,
                tick_label(v)
            );
        }
        let _ = write!(
            self.body,
            r##"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{:.1}" stroke="#000"/><text transform="translate(16 {:.1}) rotate(-90)" font-size="12" text-anchor="middle">{}</text>"##,
            HEIGHT - BOTTOM,
            (TOP + HEIGHT - BOTTOM) / 2.0,
            escape(label)
        );
    }

    fn axes(&mut self, x: &Axis, y: &Axis, x_label: &str, y_label: &str) {
        self.y_axis(y, y_label);
        let base = HEIGHT - BOTTOM;
        for v in x.ticks() {
            let px = x.at(v);
            let _ = write!(
                self.body,
                r##"<line x1="{px:.1}" y1="{base}" x2="{px:.1}" y2="{:.1}" stroke="#000"/><text x="{px:.1}" y="{:.1}" font-size="11" text-anchor="middle">{}</text>"##,
                base + 4.0,
                base + 17.0,
                tick_label(v)
            );
        }
        let _ = write!(
            self.body,
            r##"<line x1="{LEFT}" y1="{base}" x2="{:.1}" y2="{base}" stroke="#000"/><text x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle">{}</text>"##,
            WIDTH - RIGHT,
            (LEFT + WIDTH - RIGHT) / 2.0,
            HEIGHT - 18.0,
            escape(x_label)
        );
    }

    fn legend(&mut self, index: usize, colour: &str, text: &str) {
        let (lx, ly) = (WIDTH - RIGHT + 16.0, TOP + 10.0 + 20.0 * index as f64);
        let _ = write!(
            self.body,
            r#"<rect x="{lx:.1}" y="{:.1}" width="12" height="12" fill="{colour}"/><text x="{:.1}" y="{:.1}" font-size="12">{}</text>"#,
            ly - 10.0,
            lx + 18.0,
            ly,
            escape(text)
        );
    }

    fn write(mut self, path: &Path) -> io::Result<()> {
        self.body.push_str("</svg>\n");
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, self.body)
    }
}

/// The smallest of 1, 2, 2.5, 5 × 10^k at or above `v`, so ticks read well.
fn nice_ceiling(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let magnitude = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0].into_iter().map(|m| m * magnitude).find(|&c| c >= v).unwrap_or(v)
}

fn tick_label(v: f64) -> String {
    if v == v.trunc() && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundary_chart_names_each_series_with_its_total() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("burst.svg");
        let series = [
            ("fixed_window", vec![(0, 1), (100, 100), (250, 200)]),
            ("sliding_window_counter", vec![(0, 1), (100, 100)]),
        ];
        boundary_burst_svg(&path, 100, &series).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("fixed_window: 200") && svg.contains("sliding_window_counter: 100"));
        assert_eq!(svg.matches("stroke-dasharray").count(), 2, "boundaries at 100 and 200");
    }

    #[test]
    fn a_counts_chart_has_one_line_per_series_with_its_total() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("refused.svg");
        let series = [("api", vec![0, 3, 5]), ("login & co", vec![1, 0, 0])];
        counts_over_time_svg(&path, "t", "minutes", "n", 5.0, &series).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert_eq!(svg.matches("<path ").count(), 2);
        assert!(svg.contains("api: 8") && svg.contains("login &amp; co: 1"));
        counts_over_time_svg(&path, "t", "minutes", "n", 5.0, &[("empty", vec![])]).unwrap();
    }

    #[test]
    fn ceilings_are_round() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(3.2), 5.0);
        assert_eq!(nice_ceiling(200.0), 200.0);
        assert_eq!(nice_ceiling(201.0), 250.0);
        assert_eq!(nice_ceiling(0.004), 0.005);
    }
}
