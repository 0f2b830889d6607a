//! Unit tests of the paired ratio (`ratio.rs`): the bootstrap, the verdicts, the cycle order
//! and the /proc readers.

use super::*;

fn est(median: f64, lo: f64, hi: f64) -> Estimate {
    Estimate {
        median,
        lo,
        hi,
        n: 60,
    }
}

#[test]
fn bootstrap_is_seeded_and_brackets_the_median() {
    let mut rng = SplitMix64::new(7);
    let ratios: Vec<f64> = (0..60)
        .map(|_| 0.95 + (rng.below(1000) as f64) / 10_000.0)
        .collect();
    let a = bootstrap_median(&ratios, 2000, 1).unwrap();
    let b = bootstrap_median(&ratios, 2000, 1).unwrap();
    assert_eq!(a, b, "same seed, same interval");
    assert!(a.lo <= a.median && a.median <= a.hi, "{a:?}");
    assert!(a.lo >= 0.95 && a.hi <= 1.05, "{a:?}");
    assert_eq!(a.n, 60);
    // Constant data: a zero-width interval on the value.
    let c = bootstrap_median(&[0.97; 10], 500, 3).unwrap();
    assert_eq!((c.median, c.lo, c.hi), (0.97, 0.97, 0.97));
    assert!(bootstrap_median(&[], 500, 3).is_none());
}

#[test]
fn more_windows_narrow_the_interval() {
    let mut rng = SplitMix64::new(11);
    let mut draw = |n: usize| -> Vec<f64> {
        (0..n)
            .map(|_| 0.9 + (rng.below(2000) as f64) / 10_000.0)
            .collect()
    };
    let few = bootstrap_median(&draw(8), 4000, 5).unwrap();
    let many = bootstrap_median(&draw(400), 4000, 5).unwrap();
    assert!(many.width() < few.width() / 2.0, "{few:?} {many:?}");
}

#[test]
fn verdicts_follow_the_interval() {
    assert_eq!(judge(&est(0.99, 0.985, 0.995), 0.98, 0.02).0, Verdict::Met);
    assert_eq!(judge(&est(0.98, 0.98, 0.99), 0.98, 0.02).0, Verdict::Met);
    assert_eq!(
        judge(&est(0.95, 0.94, 0.97), 0.98, 0.02).0,
        Verdict::Refuted
    );
    let (v, why) = judge(&est(0.97, 0.90, 1.02), 0.98, 0.02);
    assert_eq!(v, Verdict::NotResolved);
    // Width 0.12 vs 0.02: 36 times the windows (60 -> 2160).
    assert!(
        why.contains("wider than the 2%") && why.contains("~2160"),
        "{why}"
    );
    let (v, why) = judge(&est(0.98, 0.975, 0.985), 0.98, 0.02);
    assert_eq!(v, Verdict::NotResolved);
    assert!(why.contains("narrower than 2%"), "{why}");
}

#[test]
fn irq_and_softirq_columns_in_ns() {
    let stat = "cpu  100 0 50 900 0 3 7 2 0 0\ncpu0 50 0 25 450 0 1 3 1 0 0\n";
    // (3 + 7) ticks at 100 Hz.
    assert_eq!(irq_softirq_ns(stat, "cpu ", 100), Some(100_000_000));
    assert_eq!(irq_softirq_ns(stat, "cpu0 ", 100), Some(40_000_000));
    assert_eq!(irq_softirq_ns(stat, "cpu1 ", 100), None);
}

#[test]
fn cycles_balance_positions() {
    let mut first = [0usize; 4];
    for i in 0..8 {
        let o = cycle_order(i);
        first[ARMS.iter().position(|a| *a == o[0]).unwrap()] += 1;
        let mut s = o.to_vec();
        s.sort_by_key(|a| ARMS.iter().position(|b| b == a));
        assert_eq!(s, ARMS.to_vec(), "each arm once per cycle");
    }
    assert_eq!(first, [2, 2, 2, 2]);
}

#[test]
fn reads_rx_packets_of_one_device() {
    let text = "Inter-|   Receive    |  Transmit\n \
                face |bytes packets errs|bytes packets\n    \
                lo: 10 1 0 0 0 0 0 0 10 1 0 0 0 0 0 0\n  \
                sink0: 1234 56 0 0 0 0 0 0 99 7 0 0 0 0 0 0\n";
    assert_eq!(net_dev_rx_packets(text, "sink0"), Some(56));
    assert_eq!(net_dev_rx_packets(text, "lo"), Some(1));
    assert_eq!(net_dev_rx_packets(text, "nic0"), None);
}
