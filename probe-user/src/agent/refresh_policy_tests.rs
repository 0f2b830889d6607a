use super::*;

/// The whole table read with every Service: what a due refresh without names does.
const READ_EVERYTHING: Action = Action::Read {
    whole: true,
    everything: true,
};

#[test]
fn a_burst_of_signals_is_one_read_and_reads_are_a_gap_apart() {
    let t0 = Instant::now();
    let mut p = Pacer::default();
    assert_eq!(p.due(true), None);
    // The first signal (start) is due at once.
    p.signal(t0);
    assert_eq!(p.due(true), Some(t0));
    p.started(t0, true);
    assert_eq!(p.due(true), None);
    // A burst during the next 100 ms: one read, MIN_GAP after the last start.
    for ms in [10, 50, 100] {
        p.signal(t0 + Duration::from_millis(ms));
    }
    assert_eq!(p.due(true), Some(t0 + MIN_GAP));
    p.started(t0 + MIN_GAP, true);
    // Long after: due SETTLE after the signal.
    let later = t0 + Duration::from_secs(10);
    p.signal(later);
    p.signal(later + Duration::from_millis(150));
    assert_eq!(p.due(true), Some(later + SETTLE));
    // A read that took 1 s: the next one 20 s after its start, however soon it is asked.
    p.started(later + SETTLE, true);
    p.finished(Duration::from_secs(1), true);
    p.signal(later + Duration::from_secs(5));
    assert_eq!(
        p.due(true),
        Some(later + SETTLE + Duration::from_secs(READ_DUTY.into()))
    );
    // One that took 10 s: MAX_GAP, not 200 s.
    p.started(later + Duration::from_secs(30), true);
    p.finished(Duration::from_secs(10), true);
    p.signal(later + Duration::from_secs(41));
    assert_eq!(p.due(true), Some(later + Duration::from_secs(30) + MAX_GAP));
}

#[test]
fn a_small_read_is_not_held_back_by_a_long_whole_one() {
    let t0 = Instant::now();
    let mut p = Pacer::default();
    // A full restore: a whole read of 1.6 s.
    p.signal(t0);
    p.started(t0, true);
    p.finished(Duration::from_millis(1600), true);
    // A Service added 2 s later names three chains: read once MIN_GAP and SETTLE allow,
    // not 30 s after the whole read.
    let added = t0 + Duration::from_secs(2);
    p.signal(added);
    assert_eq!(p.due(false), Some(added + SETTLE));
    // Another full restore then waits for the whole read's duty gap.
    assert_eq!(p.due(true), Some(t0 + MAX_GAP));
    p.started(added + SETTLE, false);
    p.finished(Duration::from_millis(100), false);
    // Small reads of 0.1 s each: 2 s apart (20 x 0.1 s), at least MIN_GAP.
    let next = added + Duration::from_secs(1);
    p.signal(next);
    assert_eq!(
        p.due(false),
        Some(added + SETTLE + Duration::from_millis(100) * READ_DUTY)
    );
}

const EVERY: Duration = Duration::from_secs(600);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// What commits named (chains a small read can answer).
const NAMED: Seen = Seen {
    api_ready: false,
    touched_whole: false,
    no_services: false,
};

/// The first read (whole, at once), done after `took`; the policy and when it finished.
fn after_first_read(api: bool, took: Duration) -> (RefreshPolicy, Instant) {
    let t0 = Instant::now();
    let mut p = RefreshPolicy::new(t0, EVERY, api);
    let first = Seen {
        touched_whole: true,
        ..NAMED
    };
    assert_eq!(p.next(first, t0), READ_EVERYTHING);
    let done = t0 + took;
    p.step(
        Signal::ReadDone {
            took,
            whole: true,
            ok: true,
        },
        done,
    );
    (p, done)
}

/// Due at `due`: the policy waits a settle, then reads the whole table with every Service.
#[track_caller]
fn assert_settles_then_reads_everything(p: &mut RefreshPolicy, seen: Seen, due: Instant) {
    assert_eq!(
        p.next(seen, due),
        Action::Wait {
            until: due + SETTLE
        }
    );
    assert_eq!(p.next(seen, due + SETTLE), READ_EVERYTHING);
}

#[test]
fn a_change_after_a_quiet_spell_is_read_a_settle_later_and_only_what_it_named() {
    let (mut p, done) = after_first_read(false, ms(10));
    // Quiet: only the safety net is ahead.
    assert_eq!(
        p.next(NAMED, done),
        Action::Wait {
            until: done + EVERY
        }
    );
    let commit = done + secs(10);
    p.step(Signal::Changed, commit);
    assert_eq!(
        p.next(NAMED, commit),
        Action::Wait {
            until: commit + SETTLE
        }
    );
    // More of the burst does not move it.
    p.step(Signal::Changed, commit + ms(100));
    assert_eq!(
        p.next(NAMED, commit + ms(150)),
        Action::Wait {
            until: commit + SETTLE
        }
    );
    assert_eq!(
        p.next(NAMED, commit + SETTLE),
        Action::Read {
            whole: false,
            everything: false
        }
    );
}

#[test]
fn a_whole_read_waits_its_duty_gap_and_a_commit_read_whole_is_paced_as_whole() {
    let (mut p, done) = after_first_read(false, secs(1));
    let t0 = done - secs(1);
    // A full restore 5 s later: 20 x 1 s after the first read's start.
    p.step(Signal::Changed, t0 + secs(5));
    let restore = Seen {
        touched_whole: true,
        ..NAMED
    };
    let duty = t0 + secs(READ_DUTY.into());
    assert_eq!(p.next(restore, t0 + secs(5)), Action::Wait { until: duty });
    assert_eq!(
        p.next(restore, duty),
        Action::Read {
            whole: true,
            everything: false
        }
    );
}

#[test]
fn a_failed_read_is_retried_whole_after_retry() {
    let (mut p, done) = after_first_read(false, ms(10));
    p.step(Signal::Changed, done + secs(10));
    let start = done + secs(10) + SETTLE;
    assert!(matches!(p.next(NAMED, start), Action::Read { .. }));
    let failed = start + ms(5);
    p.step(
        Signal::ReadDone {
            took: ms(5),
            whole: false,
            ok: false,
        },
        failed,
    );
    let retry = failed + RETRY;
    assert_eq!(p.next(NAMED, failed), Action::Wait { until: retry });
    // Woken early (another wait ended): nothing yet.
    p.step(Signal::Woke, retry - ms(1));
    assert_eq!(p.next(NAMED, retry - ms(1)), Action::Wait { until: retry });
    // Due, as every signal, a settle later.
    p.step(Signal::Woke, retry);
    assert_settles_then_reads_everything(&mut p, NAMED, retry);
}

#[test]
fn the_safety_net_reads_whole_every_interval() {
    let (mut p, done) = after_first_read(false, ms(10));
    let net = done + EVERY;
    assert_eq!(p.next(NAMED, done), Action::Wait { until: net });
    p.step(Signal::Woke, net);
    assert_eq!(p.next(NAMED, net + SETTLE), READ_EVERYTHING);
    let read = net + SETTLE + ms(10);
    p.step(
        Signal::ReadDone {
            took: ms(10),
            whole: true,
            ok: true,
        },
        read,
    );
    assert_eq!(
        p.next(NAMED, read),
        Action::Wait {
            until: read + EVERY
        }
    );
}

#[test]
fn once_the_api_is_ready_its_tables_are_made_at_most_every_api_every_or_duty() {
    let (mut p, done) = after_first_read(true, ms(10));
    assert!(!p.api_on());
    let ready = Seen {
        api_ready: true,
        ..NAMED
    };
    assert_eq!(p.next(ready, done), Action::ApiOn);
    assert!(p.api_on());
    assert_eq!(p.next(ready, done), Action::MakeFromApi);
    // A table that took 100 ms to make: the next one 10 x 100 ms after its start.
    p.step(
        Signal::MadeFromApi {
            started: done,
            took: ms(100),
        },
        done + ms(100),
    );
    p.step(Signal::ApiChanged, done + ms(150));
    let next = done + ms(100) * API_DUTY;
    assert_eq!(p.next(ready, done + ms(150)), Action::Wait { until: next });
    assert_eq!(p.next(ready, next), Action::MakeFromApi);
    // A quick one: API_EVERY apart.
    p.step(
        Signal::MadeFromApi {
            started: next,
            took: ms(1),
        },
        next + ms(1),
    );
    p.step(Signal::ApiChanged, next + ms(2));
    assert_eq!(
        p.next(ready, next + ms(2)),
        Action::Wait {
            until: next + API_EVERY
        }
    );
    // Nothing changed in the API: no table, whatever the time.
    assert_eq!(p.next(ready, next + API_EVERY), Action::MakeFromApi);
    assert_eq!(
        p.next(ready, next + secs(60)),
        Action::Wait {
            until: done + EVERY
        }
    );
    // The API wait is over once the table is the API's: an empty table is not read whole.
    let empty = Seen {
        no_services: true,
        ..ready
    };
    assert!(matches!(
        p.next(empty, done + API_WAIT + secs(1)),
        Action::Wait { .. }
    ));
}

#[test]
fn without_the_apis_lists_a_start_that_read_no_services_reads_whole_after_api_wait() {
    let (mut p, done) = after_first_read(true, ms(10));
    let t0 = done - ms(10);
    let empty = Seen {
        no_services: true,
        ..NAMED
    };
    assert_eq!(
        p.next(empty, done),
        Action::Wait {
            until: t0 + API_WAIT
        }
    );
    let late = t0 + API_WAIT;
    assert_eq!(p.next(empty, late), Action::ApiLate);
    assert_settles_then_reads_everything(&mut p, empty, late);
}

#[test]
fn a_start_whose_table_has_services_does_not_wait_for_the_api() {
    let (mut p, done) = after_first_read(true, ms(10));
    let late = done - ms(10) + API_WAIT;
    assert_eq!(
        p.next(NAMED, late),
        Action::Wait {
            until: done + EVERY
        }
    );
    // Given up once: a later empty table is not read whole for it.
    let empty = Seen {
        no_services: true,
        ..NAMED
    };
    assert_eq!(
        p.next(empty, late + secs(1)),
        Action::Wait {
            until: done + EVERY
        }
    );
}

#[test]
fn the_ipvs_change_test_is_paced_by_its_own_cost() {
    let t0 = Instant::now();
    let mut p = DigestPacer::default();
    assert!(p.due(t0), "the first test runs at once");
    // A 10 ms dump: due again after 200 ms (the poll tick's 1 s is the real floor).
    p.ran(t0, Duration::from_millis(10));
    assert!(!p.due(t0 + Duration::from_millis(199)));
    assert!(p.due(t0 + Duration::from_millis(200)));
    // A 500 ms dump (10,000 virtual services under emulation): 10 s apart, not every second.
    p.ran(t0, Duration::from_millis(500));
    assert!(!p.due(t0 + Duration::from_secs(9)));
    assert!(p.due(t0 + Duration::from_secs(10)));
    // A 5 s dump: never more than MAX_GAP apart, or a change would wait for minutes.
    p.ran(t0, Duration::from_secs(5));
    assert!(!p.due(t0 + MAX_GAP - Duration::from_millis(1)));
    assert!(p.due(t0 + MAX_GAP));
}
