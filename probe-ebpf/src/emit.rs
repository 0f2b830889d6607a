//! Counting and reporting: exact per-CPU counters, then, for an anomaly only, deduplication,
//! the per-class event budget and one record written straight into the ring buffer, with a
//! wake-up only when a batch has built up or the record confirms an event.

use aya_ebpf::{
    bindings::{
        BPF_RB_AVAIL_DATA, BPF_RB_CONS_POS, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP, BPF_RB_PROD_POS,
    },
    maps::PerCpuHashMap,
};
use probe_common::{
    CAPTURE_MAX, CapturedPacketEvent, FlowKey, PacketEvent, ProbeConfig, budget, kind, stat,
};

use crate::{
    maps::{BUDGET, EVENTS, RECENT, STATS, WAKE_POS},
    packet::{Packet, PacketBytes, bytes},
};

#[inline(always)]
pub(crate) fn stat_add(index: u32) {
    if let Some(slot) = STATS.get_ptr_mut(index) {
        // SAFETY: a valid pointer into this CPU's slot of a per-CPU map: no concurrent writer.
        unsafe { *slot += 1 };
    }
}

/// Per-CPU counter in a hash map: exact without atomics (tc and tracepoint programs do not
/// nest on one CPU for the same map slot; an insert race across CPUs is impossible per-CPU).
#[inline(always)]
pub(crate) fn count<K>(map: &PerCpuHashMap<K, u64>, key: &K) {
    match map.get_ptr_mut(key) {
        // SAFETY: a valid pointer into this CPU's value of a per-CPU map: no concurrent writer.
        Some(v) => unsafe { *v += 1 },
        None => {
            let _ = map.insert(key, 1, 0);
        }
    }
}

/// Deduplication and budget: true when an event for `flow` (from a `src_tag` source) may
/// leave the kernel now. Each (kind, source tag) class spends its own budget (see
/// `probe_common::budget`): a suspect flood cannot starve a health check's records.
#[inline(always)]
pub(crate) fn may_emit(flow: &FlowKey, src_tag: u8, now: u64, cfg: &ProbeConfig) -> bool {
    if let Some(last) = RECENT.get_ptr_mut(flow)
        // SAFETY: a valid pointer into the map's value for this run; a torn read only changes one dedup decision.
        && now.wrapping_sub(unsafe { *last }) < cfg.dedup_ns
    {
        stat_add(stat::DEDUP_SUPPRESSED);
        return false;
    }
    let Some(budget) = BUDGET.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: a valid pointer into this CPU's value of a per-CPU map: no concurrent writer.
    let budget = unsafe { &mut *budget };
    if now.wrapping_sub(budget.window_start_ns) >= 1_000_000_000 {
        budget.window_start_ns = now;
        budget.used = [0; budget::CLASSES];
        budget.wakeups = 0;
    }
    // Opaque to the compiler, so the bounds check it cannot prove redundant stays for the
    // verifier: 5.10's loses the bounds of the class's masked OR and rejects the index.
    let class = core::hint::black_box(budget::class(flow.kind, src_tag));
    let Some(used) = budget.used.get_mut(class) else {
        return false;
    };
    if u64::from(*used) >= cfg.events_per_sec {
        stat_add(stat::BUDGET_SUPPRESSED);
        stat_add(stat::BUDGET_SUPPRESSED_BY_CLASS + class as u32);
        return false;
    }
    *used += 1;
    // Only flows that were actually emitted enter RECENT, so a suppressed flow gets its event
    // as soon as budget is back.
    let _ = RECENT.insert(flow, now, 0);
    true
}

/// Submit flags of a confirming record (a drop: the suspect it pairs with is already in the
/// ring, so waking now delivers both): an immediate wake-up unless one is still being served,
/// at most `wakeups_per_sec` per CPU per budget window (`may_emit` just opened it if due).
#[inline(always)]
pub(crate) fn confirming_wakeup(cfg: &ProbeConfig) -> u64 {
    let Some(wake_pos) = WAKE_POS.get_ptr_mut(0) else {
        return BPF_RB_NO_WAKEUP as u64;
    };
    // SAFETY: a valid pointer into this CPU's value of a per-CPU map: no concurrent writer.
    if EVENTS.query(BPF_RB_CONS_POS as u64) < unsafe { *wake_pos } {
        return BPF_RB_NO_WAKEUP as u64;
    }
    let Some(budget) = BUDGET.get_ptr_mut(0) else {
        return BPF_RB_NO_WAKEUP as u64;
    };
    // SAFETY: a valid pointer into this CPU's value of a per-CPU map: no concurrent writer.
    let budget = unsafe { &mut *budget };
    if u64::from(budget.wakeups) >= cfg.wakeups_per_sec {
        stat_add(stat::WAKEUP_BUDGET_SUPPRESSED);
        return BPF_RB_NO_WAKEUP as u64;
    }
    budget.wakeups += 1;
    // SAFETY: a valid pointer into this CPU's value of a per-CPU map: no concurrent writer.
    unsafe { *wake_pos = EVENTS.query(BPF_RB_PROD_POS as u64) + 1 };
    stat_add(stat::WAKEUPS);
    BPF_RB_FORCE_WAKEUP as u64
}

/// What a record says beyond the packet itself.
pub(crate) struct Meta {
    pub(crate) kind: u8,
    pub(crate) src_tag: u8,
    pub(crate) dst_tag: u8,
    pub(crate) ifindex: u32,
    pub(crate) reason: u32,
    pub(crate) location: u64,
    pub(crate) netns: u32,
    pub(crate) now: u64,
}

// The capture's length is bounded by a mask (see `emit`).
const _: () = assert!(CAPTURE_MAX.is_power_of_two());

/// Writes one record straight into the ring buffer (no stack copy: the verifier's 512-byte
/// stack limit is shared by every frame). With `capture_bytes` set, the record carries the
/// packet's first bytes as well (`CapturedPacketEvent`), copied from `bytes` into the ring.
#[inline(always)]
pub(crate) fn emit<B: PacketBytes>(cfg: &ProbeConfig, pkt: &Packet, m: Meta, bytes: &B) {
    // Waking the reader per record costs an IPI per packet (see PERFORMANCE.md): wake it when
    // a batch has built up, or for a record that can confirm an event, else leave the record
    // to the reader's backstop timer.
    let flags = if EVENTS.query(BPF_RB_AVAIL_DATA as u64) >= cfg.wakeup_bytes {
        BPF_RB_FORCE_WAKEUP as u64
    } else if m.kind == kind::DROP {
        confirming_wakeup(cfg)
    } else {
        BPF_RB_NO_WAKEUP as u64
    };
    if cfg.capture_bytes == 0 {
        let Some(mut entry) = EVENTS.reserve::<PacketEvent>(0) else {
            stat_add(stat::RINGBUF_FULL);
            return;
        };
        // SAFETY: a reserved, exclusively owned record.
        unsafe { write_event(entry.as_mut_ptr(), pkt, &m) };
        entry.submit(flags);
    } else {
        let Some(mut entry) = EVENTS.reserve::<CapturedPacketEvent>(0) else {
            stat_add(stat::RINGBUF_FULL);
            return;
        };
        let rec = entry.as_mut_ptr();
        // SAFETY: a reserved, exclusively owned record; `event` is its first field.
        unsafe { write_event(rec.cast(), pkt, &m) };
        let want = cfg.capture_bytes.min(bytes.available());
        // The copy's length must be provably within 1..=CAPTURE_MAX (the record's `data`;
        // the helpers refuse a length that may be 0). A range check is not enough: LLVM
        // turns it into a form the 5.10-6.12 verifiers lose track of ("invalid access to
        // memory ... size=0"), and it folds an arithmetic bound away when it already knows
        // the range. So the length minus one goes through the stack (a volatile load: LLVM
        // knows nothing of it) and is bounded by a mask and a +1 every verifier follows.
        let (copied, len) = if want == 0 {
            (false, 0)
        } else {
            let below = want - 1;
            // SAFETY: a read of a local.
            let below = unsafe { core::ptr::read_volatile(&below) };
            let len = (below & (CAPTURE_MAX as u32 - 1)) + 1;
            // SAFETY: `data` holds CAPTURE_MAX bytes; `len` is at most that.
            (bytes.copy_to(unsafe { (*rec).data.as_mut_ptr() }, len), len)
        };
        // SAFETY: as above. Bytes of `data` past `cap_len` are left as the ring had them
        // (our own earlier records): the reader reads only `cap_len`.
        unsafe {
            (*rec).cap_len = if copied { len as u16 } else { 0 };
            (*rec)._pad = [0; 6];
        }
        entry.submit(flags);
    }
    stat_add(stat::EMITTED);
}

/// Fills the `PacketEvent` at `ev`, every field.
///
/// # Safety
/// `ev` points at a reserved ring-buffer record owned by the caller.
#[inline(always)]
unsafe fn write_event(ev: *mut PacketEvent, pkt: &Packet, m: &Meta) {
    // SAFETY: the function's contract: `ev` is a reserved record this run owns alone.
    unsafe {
        (*ev).ts_ns = m.now;
        (*ev).location = m.location;
        (*ev).saddr = bytes(pkt.saddr);
        (*ev).daddr = bytes(pkt.daddr);
        (*ev).ifindex = m.ifindex;
        (*ev).reason = m.reason;
        (*ev).netns = m.netns;
        (*ev).sport = pkt.sport;
        (*ev).dport = pkt.dport;
        (*ev).kind = m.kind;
        (*ev).src_tag = m.src_tag;
        (*ev).dst_tag = m.dst_tag;
        (*ev).proto = pkt.proto;
        (*ev).family = pkt.family;
        (*ev).tcp_flags = pkt.tcp_flags;
        (*ev)._pad = [0; 2];
    }
}

#[inline(always)]
pub(crate) fn flow_of(pkt: &Packet, kind_: u8) -> FlowKey {
    FlowKey {
        saddr: bytes(pkt.saddr),
        daddr: bytes(pkt.daddr),
        sport: pkt.sport,
        dport: pkt.dport,
        proto: pkt.proto,
        family: pkt.family,
        kind: kind_,
        _pad: 0,
    }
}
