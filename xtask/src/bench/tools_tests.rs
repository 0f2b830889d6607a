use super::*;

#[test]
fn syn_checksum_verifies() {
    let p = tcp_syn(
        Ipv4Addr::new(203, 0, 113, 10),
        40000,
        Ipv4Addr::new(10, 200, 0, 2),
        30080,
    );
    assert_eq!(p.len(), 40);
    // Re-summing the segment with its checksum and the pseudo-header gives zero.
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&p[12..20]);
    pseudo.extend_from_slice(&[0, 6, 0, 20]);
    let pre: u32 = pseudo
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    assert_eq!(checksum(&p[20..], pre), 0);
    assert_eq!(p[33], 0x02);
}

#[test]
fn metric_sum_filters_by_labels() {
    let text = "# HELP x y\n\
                clbprobe_suspect_packets_total{nic=\"nic0\",source=\"vip\"} 7\n\
                clbprobe_suspect_packets_total{nic=\"nic0\",source=\"node\"} 5\n\
                clbprobe_suspect_packets_total{nic=\"eth1\",source=\"node\"} 100\n\
                clbprobe_ready 1\n";
    assert_eq!(
        metric_sum(text, "clbprobe_suspect_packets_total", &[("nic", "nic0")]),
        12
    );
    assert_eq!(metric_sum(text, "clbprobe_suspect_packets_total", &[]), 112);
    assert_eq!(metric_sum(text, "clbprobe_ready", &[]), 1);
    assert_eq!(metric_sum(text, "clbprobe_nothing", &[]), 0);
}
