//! Statistics over repeated measurements and the Markdown the bench prints and writes.
//! Pure: unit-tested without root.

/// The median of `v` (mean of the middle two for an even count); NaN when empty.
pub fn median(v: &[f64]) -> f64 {
    percentile(v, 50.0)
}

/// The `p`-th percentile of `v` by linear interpolation between closest ranks; NaN when empty.
pub fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = (p / 100.0) * (s.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    s[lo] + (s[hi] - s[lo]) * (rank - lo as f64)
}

/// `median (min–max, n=N)` with `digits` decimals: the figure and its spread.
pub fn spread(v: &[f64], digits: usize) -> String {
    if v.is_empty() {
        return "n/a".to_string();
    }
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!(
        "{:.digits$} ({:.digits$}–{:.digits$}, n={})",
        median(v),
        min,
        max,
        v.len()
    )
}

/// Element-wise ratios `a[i] / b[i]` (pairs measured side by side in one round).
pub fn ratios(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter()
        .zip(b)
        .filter(|(_, b)| **b > 0.0)
        .map(|(a, b)| a / b)
        .collect()
}

/// A Markdown table with a heading and an optional note under it.
#[derive(Debug, Clone, Default)]
pub struct Table {
    pub title: String,
    pub note: String,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(title: &str, header: &[&str]) -> Table {
        Table {
            title: title.to_string(),
            header: header.iter().map(|h| h.to_string()).collect(),
            ..Default::default()
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn markdown(&self) -> String {
        let mut s = format!("## {}\n\n", self.title);
        if !self.note.is_empty() {
            s.push_str(&self.note);
            s.push_str("\n\n");
        }
        s.push_str(&format!("| {} |\n", self.header.join(" | ")));
        s.push_str(&format!(
            "|{}\n",
            self.header.iter().map(|_| "---|").collect::<String>()
        ));
        for r in &self.rows {
            s.push_str(&format!("| {} |\n", r.join(" | ")));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_percentiles() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert!((percentile(&v, 99.0) - 99.01).abs() < 1e-9);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
    }

    #[test]
    fn spread_and_ratios() {
        assert_eq!(spread(&[0.99, 0.97, 1.0], 2), "0.99 (0.97–1.00, n=3)");
        assert_eq!(spread(&[], 2), "n/a");
        assert_eq!(ratios(&[9.0, 8.0, 1.0], &[10.0, 8.0, 0.0]), vec![0.9, 1.0]);
    }

    #[test]
    fn markdown_table() {
        let mut t = Table::new("Datapath", &["case", "ratio"]);
        t.note = "side by side".into();
        t.row(vec!["udp".into(), "0.99".into()]);
        assert_eq!(
            t.markdown(),
            "## Datapath\n\nside by side\n\n| case | ratio |\n|---|---|\n| udp | 0.99 |\n"
        );
    }
}
