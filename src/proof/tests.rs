//! Script-driven tests of every decision the proof makes, in virtual time, and property tests
//! over random sequences of facts.

use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;

const OURS: &str = "0123456789abcdef0123456789abcdef";
const THEIRS: &str = "fedcba9876543210fedcba9876543210";
const NEWEST: &str = "00112233445566778899aabbccddeeff";

/// One step of a script: a fact, or time passing.
#[derive(Clone, Debug)]
enum Step {
    In(Input),
    Wait(Duration),
}

fn st(active: &str, invocation: &str) -> Step {
    Step::In(Input::State(UnitState {
        active_state: active.into(),
        invocation: invocation.into(),
        starting: false,
    }))
}

/// systemd's announcement that `invocation` starts: the unit's old state with its new
/// InvocationID.
fn starts(active: &str, invocation: &str) -> Step {
    Step::In(Input::State(UnitState {
        active_state: active.into(),
        invocation: invocation.into(),
        starting: true,
    }))
}

/// What the proof says and asks when it finds the unit running THEIRS: it stops it.
fn stopping_theirs() -> String {
    format!(
        "0ms log Warn: unit restarted outside the activator (invocation {THEIRS}, ours {OURS}); stopping it
         0ms stop-unit foreign"
    )
}

fn cg(reading: CgroupReading) -> Step {
    Step::In(Input::Cgroup(reading))
}

fn leftovers(count: usize) -> Step {
    Step::In(Input::Leftovers(Ok(count)))
}

fn stop() -> Step {
    Step::In(Input::StopRequested)
}

fn wait_ms(ms: u64) -> Step {
    Step::Wait(Duration::from_millis(ms))
}

fn render(output: &Output) -> String {
    match output {
        Output::StopUnit(StopReason::Requested) => "stop-unit requested".into(),
        Output::StopUnit(StopReason::Foreign) => "stop-unit foreign".into(),
        Output::ReadCgroup => "read-cgroup".into(),
        Output::CountLeftovers => "count-leftovers".into(),
        Output::Log(level, line) => format!("log {level:?}: {line}"),
        Output::Proven(p) => format!("proven {:?} {:?}: {}", p.cause, p.level, p.message),
    }
}

/// Runs `steps` against a fresh proof for `OURS` and returns every output, one per line, with
/// the virtual time in milliseconds it came out at.
fn transcript(steps: &[Step]) -> String {
    let start = Instant::now();
    let mut now = start;
    let mut proof = UnitProof::new(OURS.into());
    let mut lines = Vec::new();
    for step in steps {
        match step {
            Step::In(input) => proof.handle_input(input.clone(), now),
            Step::Wait(d) => {
                let until = now + *d;
                // Virtual time jumps from deadline to deadline, as a driver's timer would fire.
                while let Some(at) = proof.poll_timeout().filter(|at| *at <= until) {
                    now = at.max(now);
                    proof.handle_timeout(now);
                    drain(&mut proof, start, now, &mut lines);
                }
                now = until;
            }
        }
        drain(&mut proof, start, now, &mut lines);
    }
    lines.join("\n")
}

fn drain(proof: &mut UnitProof, start: Instant, now: Instant, lines: &mut Vec<String>) {
    while let Some(o) = proof.poll_output() {
        lines.push(format!("{}ms {}", (now - start).as_millis(), render(&o)));
    }
}

fn check(steps: &[Step], expect: &str) {
    let got = transcript(steps);
    let expect = expect
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(
        got, expect,
        "\n--- got ---\n{got}\n--- expected ---\n{expect}\n"
    );
}

#[test]
fn a_running_unit_needs_nothing() {
    check(&[st("active", OURS), st("reloading", OURS)], "");
}

#[test]
fn terminal_then_empty_cgroup_proves_exited() {
    for terminal in ["inactive", "failed"] {
        check(
            &[
                st("active", OURS),
                st(terminal, OURS),
                cg(CgroupReading::Empty),
            ],
            "0ms read-cgroup
             0ms proven Exited Warn: instance exited (status unknown: no exit record)",
        );
    }
}

#[test]
fn terminal_then_gone_cgroup_proves_exited() {
    check(
        &[st("inactive", OURS), cg(CgroupReading::Gone)],
        "0ms read-cgroup
         0ms proven Exited Warn: instance exited (status unknown: no exit record)",
    );
}

#[test]
fn an_unloaded_unit_is_inactive_with_no_invocation() {
    let unloaded = Step::In(Input::State(UnitState::unloaded()));
    check(
        &[unloaded, cg(CgroupReading::Gone)],
        "0ms read-cgroup
         0ms proven Exited Warn: instance exited (status unknown: no exit record)",
    );
}

/// What remains once ours is over is counted at each reading (and held by the driver), so a
/// count made once another invocation runs knows where and when it started; a count of them
/// proves nothing while no other invocation runs.
#[test]
fn populated_after_terminal_never_proves_counts_and_logs_once_per_two_seconds() {
    check(
        &[
            st("inactive", OURS),
            cg(CgroupReading::Populated),
            leftovers(0),
            wait_ms(1000),
            cg(CgroupReading::Populated),
            leftovers(1),
            wait_ms(1001),
            cg(CgroupReading::Populated),
            cg(CgroupReading::Empty),
        ],
        "0ms read-cgroup
         0ms count-leftovers
         0ms log Warn: processes remain after inactive; not releasing
         1000ms count-leftovers
         2001ms count-leftovers
         2001ms log Warn: processes remain after inactive; not releasing
         2001ms proven Exited Warn: instance exited (status unknown: no exit record)",
    );
}

#[test]
fn a_read_error_is_not_evidence_and_is_retried_with_backoff() {
    let err = || cg(CgroupReading::Unreadable("permission denied".into()));
    check(
        &[
            st("inactive", OURS),
            err(),
            wait_ms(50),
            err(),
            wait_ms(100),
            err(),
            wait_ms(200),
            err(),
            wait_ms(400),
            cg(CgroupReading::Empty),
        ],
        "0ms read-cgroup
         0ms log Warn: cgroup.events: permission denied
         50ms read-cgroup
         150ms read-cgroup
         350ms read-cgroup
         750ms read-cgroup
         750ms proven Exited Warn: instance exited (status unknown: no exit record)",
    );
}

#[test]
fn a_read_error_log_is_rate_limited_and_the_backoff_is_capped() {
    let err = || cg(CgroupReading::Unreadable("i/o error".into()));
    let mut steps = vec![st("failed", OURS)];
    for _ in 0..8 {
        steps.push(err());
        steps.push(wait_ms(2000));
    }
    let got = transcript(&steps);
    let logs = got.lines().filter(|l| l.contains("log Warn")).count();
    // 8 errors 2 s apart: logged only once more than 2 s have passed, at 0, 4, 8 and 12 s.
    assert_eq!(logs, 4, "{got}");
    let mut proof = UnitProof::new(OURS.into());
    let now = Instant::now();
    proof.handle_input(
        Input::State(UnitState {
            active_state: "failed".into(),
            invocation: OURS.into(),
            starting: false,
        }),
        now,
    );
    for _ in 0..20 {
        proof.handle_input(Input::Cgroup(CgroupReading::Unreadable("x".into())), now);
    }
    assert_eq!(proof.poll_timeout(), Some(now + RETRY_MAX));
}

#[test]
fn a_reading_while_the_state_does_not_need_it_decides_nothing() {
    check(
        &[
            st("active", OURS),
            cg(CgroupReading::Empty),
            cg(CgroupReading::Gone),
            st("deactivating", OURS),
            cg(CgroupReading::Empty),
        ],
        "",
    );
}

#[test]
fn no_state_no_decision() {
    check(&[cg(CgroupReading::Empty), cg(CgroupReading::Gone)], "");
    check(
        &[
            st("inactive", OURS),
            Step::In(Input::StateUnknown),
            cg(CgroupReading::Empty),
        ],
        "0ms read-cgroup",
    );
}

#[test]
fn a_state_lost_cancels_a_pending_retry() {
    check(
        &[
            st("inactive", OURS),
            cg(CgroupReading::Unreadable("eio".into())),
            Step::In(Input::StateUnknown),
            wait_ms(10_000),
        ],
        "0ms read-cgroup
         0ms log Warn: cgroup.events: eio",
    );
}

#[test]
fn a_foreign_invocation_is_stopped_once_then_proven_restarted_outside() {
    check(
        &[
            st("active", OURS),
            st("active", THEIRS),
            cg(CgroupReading::Populated),
            st("deactivating", THEIRS),
            cg(CgroupReading::Populated),
            st("inactive", THEIRS),
            cg(CgroupReading::Empty),
        ],
        &format!(
            "{stopping}
             0ms read-cgroup
             0ms log Warn: processes remain after active; not releasing
             0ms read-cgroup
             0ms read-cgroup
             0ms proven RestartedOutside Warn: instance exited (status unknown: restarted outside the activator)",
            stopping = stopping_theirs()
        ),
    );
}

/// The foreign invocation we stopped is over once systemd runs yet another one (whose end we
/// may never hear of: a `RemainAfterExit=` unit stays `active`): the cgroup decides then, gone
/// proving ours restarted outside, populated counting what is not certainly the newest's.
#[test]
fn a_foreign_invocation_we_stopped_is_over_once_systemd_runs_another() {
    check(
        &[
            st("active", OURS),
            st("active", THEIRS),
            st("active", NEWEST),
            cg(CgroupReading::Gone),
        ],
        &format!(
            "{stopping}
             0ms read-cgroup
             0ms read-cgroup
             0ms proven RestartedOutside Warn: instance exited (status unknown: restarted outside the activator)",
            stopping = stopping_theirs()
        ),
    );
    check(
        &[
            st("active", THEIRS),
            st("active", NEWEST),
            cg(CgroupReading::Populated),
            leftovers(0),
        ],
        &format!(
            "{stopping}
             0ms read-cgroup
             0ms read-cgroup
             0ms count-leftovers
             0ms proven RestartedOutside Warn: instance exited (status unknown: restarted outside the activator)",
            stopping = stopping_theirs()
        ),
    );
}

/// A stop of the foreign invocation that failed (the bus went away before systemd's answer)
/// leaves that invocation running with nothing to end it: the next state that shows it, or the
/// retry timer, asks for a stop again, and until the stop that worked is over no reading proves
/// ours.
#[test]
fn a_foreign_stop_that_failed_is_asked_again_at_the_next_state() {
    let restarted = format!(
        "{}
         0ms read-cgroup",
        stopping_theirs()
    );
    check(
        &[
            st("active", OURS),
            st("active", THEIRS),
            Step::In(Input::ForeignStopFailed),
            cg(CgroupReading::Gone),
            st("active", THEIRS),
            st("inactive", THEIRS),
            cg(CgroupReading::Gone),
        ],
        &format!(
            "{restarted}
             {restarted}
             0ms read-cgroup
             0ms proven RestartedOutside Warn: instance exited (status unknown: restarted outside the activator)"
        ),
    );
    // With no state to follow (systemd refused, and the unit is quiet), the retry timer asks.
    check(
        &[
            st("active", THEIRS),
            Step::In(Input::ForeignStopFailed),
            wait_ms(50),
        ],
        &format!(
            "{restarted}
             50ms log Warn: unit restarted outside the activator (invocation {THEIRS}, ours {OURS}); stopping it
             50ms stop-unit foreign
             50ms read-cgroup"
        ),
    );
    // A stop that failed once systemd said the invocation is over needs no other.
    check(
        &[
            st("active", THEIRS),
            st("inactive", THEIRS),
            Step::In(Input::ForeignStopFailed),
            cg(CgroupReading::Gone),
        ],
        &format!(
            "{restarted}
             0ms read-cgroup
             0ms proven RestartedOutside Warn: instance exited (status unknown: restarted outside the activator)"
        ),
    );
    // Once a stop of ours was asked, a later invocation proves ours over: nothing to stop.
    check(
        &[
            st("active", OURS),
            st("active", THEIRS),
            stop(),
            Step::In(Input::ForeignStopFailed),
            st("active", THEIRS),
        ],
        &format!(
            "{restarted}
             0ms stop-unit requested
             0ms read-cgroup
             0ms read-cgroup"
        ),
    );
}

/// systemd's announcement that an invocation starts (the old state with the new InvocationID)
/// is neither our invocation's end nor the end of a foreign one we stop: only a later state is.
#[test]
fn an_invocations_start_is_not_its_end() {
    check(
        &[
            st("active", OURS),
            starts("inactive", THEIRS),
            cg(CgroupReading::Gone),
            st("activating", THEIRS),
            cg(CgroupReading::Populated),
            st("inactive", THEIRS),
            cg(CgroupReading::Gone),
        ],
        &format!(
            "{stopping}
             0ms read-cgroup
             0ms read-cgroup
             0ms log Warn: processes remain after activating; not releasing
             0ms read-cgroup
             0ms proven RestartedOutside Warn: instance exited (status unknown: restarted outside the activator)",
            stopping = stopping_theirs()
        ),
    );
    check(&[starts("failed", OURS), cg(CgroupReading::Gone)], "");
}

#[test]
fn foreign_takes_precedence_over_terminal() {
    // A foreign invocation that is already inactive is still foreign: stopped once, then the
    // cgroup decides, and the cause is "restarted outside", not "exited".
    check(
        &[st("inactive", THEIRS), cg(CgroupReading::Gone)],
        &format!(
            "{stopping}
             0ms read-cgroup
             0ms proven RestartedOutside Warn: instance exited (status unknown: restarted outside the activator)",
            stopping = stopping_theirs()
        ),
    );
}

#[test]
fn stop_then_a_new_invocation_with_none_of_ours_left_proves_replaced_after_stop() {
    check(
        &[
            st("active", OURS),
            stop(),
            st("activating", THEIRS),
            cg(CgroupReading::Populated),
            leftovers(0),
        ],
        "0ms stop-unit requested
         0ms read-cgroup
         0ms count-leftovers
         0ms proven ReplacedAfterStop Warn: instance exited (status unknown: replaced after stop)",
    );
}

#[test]
fn stop_then_a_new_invocation_in_an_empty_cgroup_proves_replaced_after_stop() {
    check(
        &[
            st("active", OURS),
            stop(),
            st("activating", THEIRS),
            cg(CgroupReading::Gone),
        ],
        "0ms stop-unit requested
         0ms read-cgroup
         0ms proven ReplacedAfterStop Warn: instance exited (status unknown: replaced after stop)",
    );
}

#[test]
fn leftovers_of_our_stopped_invocation_beside_a_new_one_are_followed_until_none_remain() {
    // KillMode=process: our invocation ended with processes left in its cgroup, and systemd
    // started the next one beside them.
    check(
        &[
            st("active", OURS),
            stop(),
            st("inactive", OURS),
            cg(CgroupReading::Populated),
            st("activating", THEIRS),
            cg(CgroupReading::Populated),
            leftovers(2),
            wait_ms(3000),
            leftovers(1),
            Step::In(Input::Leftovers(Err("listing failed".into()))),
            wait_ms(50),
            cg(CgroupReading::Populated),
            leftovers(0),
        ],
        "0ms stop-unit requested
         0ms read-cgroup
         0ms count-leftovers
         0ms log Warn: processes remain after inactive; not releasing
         0ms read-cgroup
         0ms count-leftovers
         0ms log Warn: 2 processes of our invocation remain beside the new one; not releasing
         3000ms log Warn: 1 processes of our invocation remain beside the new one; not releasing
         3000ms log Warn: count leftovers: listing failed
         3050ms read-cgroup
         3050ms count-leftovers
         3050ms proven ReplacedAfterStop Warn: instance exited (status unknown: replaced after stop)",
    );
}

#[test]
fn stop_then_no_invocation_in_a_non_terminal_state_proves_replaced_after_stop() {
    check(
        &[
            st("active", OURS),
            stop(),
            st("activating", ""),
            cg(CgroupReading::Populated),
            leftovers(0),
        ],
        "0ms stop-unit requested
         0ms read-cgroup
         0ms count-leftovers
         0ms proven ReplacedAfterStop Warn: instance exited (status unknown: replaced after stop)",
    );
}

#[test]
fn stop_with_a_foreign_state_already_known_counts_leftovers() {
    // The foreign invocation was seen before any stop of ours, so it was stopped as foreign;
    // a stop requested after that needs only none of ours left beside it.
    check(
        &[
            st("active", THEIRS),
            cg(CgroupReading::Populated),
            stop(),
            cg(CgroupReading::Populated),
            leftovers(0),
        ],
        &format!(
            "{stopping}
             0ms read-cgroup
             0ms log Warn: processes remain after active; not releasing
             0ms stop-unit requested
             0ms read-cgroup
             0ms count-leftovers
             0ms proven ReplacedAfterStop Warn: instance exited (status unknown: replaced after stop)",
            stopping = stopping_theirs()
        ),
    );
}

#[test]
fn stop_requested_never_fires_a_foreign_stop() {
    // Terminal foreign invocation after our stop: foreign wins over terminal, so not terminal,
    // so replaced after stop.
    check(
        &[
            st("active", OURS),
            stop(),
            st("inactive", THEIRS),
            cg(CgroupReading::Empty),
        ],
        "0ms stop-unit requested
         0ms read-cgroup
         0ms proven ReplacedAfterStop Warn: instance exited (status unknown: replaced after stop)",
    );
}

#[test]
fn stop_then_our_invocation_deactivates_and_the_cgroup_decides() {
    check(
        &[
            st("active", OURS),
            stop(),
            st("deactivating", OURS),
            st("failed", OURS),
            cg(CgroupReading::Populated),
            cg(CgroupReading::Empty),
        ],
        "0ms stop-unit requested
         0ms read-cgroup
         0ms count-leftovers
         0ms log Warn: processes remain after failed; not releasing
         0ms proven Exited Warn: instance exited (status unknown: no exit record)",
    );
}

#[test]
fn a_second_stop_request_issues_stop_unit_again() {
    check(
        &[st("active", OURS), stop(), stop()],
        "0ms stop-unit requested
         0ms stop-unit requested",
    );
}

#[test]
fn proven_is_final() {
    check(
        &[
            st("inactive", OURS),
            cg(CgroupReading::Empty),
            st("active", THEIRS),
            stop(),
            cg(CgroupReading::Populated),
            Step::In(Input::StateUnknown),
            wait_ms(10_000),
        ],
        "0ms read-cgroup
         0ms proven Exited Warn: instance exited (status unknown: no exit record)",
    );
}

#[test]
fn a_watch_with_no_invocation_treats_any_invocation_as_foreign() {
    let mut proof = UnitProof::new(String::new());
    let now = Instant::now();
    proof.handle_input(
        Input::State(UnitState {
            active_state: "active".into(),
            invocation: THEIRS.into(),
            starting: false,
        }),
        now,
    );
    let outputs: Vec<_> = std::iter::from_fn(|| proof.poll_output()).collect();
    assert!(
        outputs.contains(&Output::StopUnit(StopReason::Foreign)),
        "{outputs:?}"
    );
    assert!(
        matches!(&outputs[0], Output::Log(_, line) if line.contains("ours none")),
        "{outputs:?}"
    );
}

#[test]
fn phases_follow_the_life_of_the_unit() {
    let now = Instant::now();
    let mut proof = UnitProof::new(OURS.into());
    assert_eq!(proof.phase(), Phase::Watching);
    proof.handle_input(Input::StopRequested, now);
    assert_eq!(proof.phase(), Phase::Stopping);
    assert!(proof.stop_requested());
    proof.handle_input(Input::State(UnitState::unloaded()), now);
    proof.handle_input(Input::Cgroup(CgroupReading::Gone), now);
    assert_eq!(proof.phase(), Phase::Proven);
    assert_eq!(proof.proof().map(|p| p.cause), Some(Cause::Exited));
    assert_eq!(proof.last_reading(), Some(&CgroupReading::Gone));
}

// ---- properties over random sequences of facts ----

fn any_step() -> impl Strategy<Value = Step> {
    let active = prop::sample::select(vec![
        "active",
        "activating",
        "deactivating",
        "reloading",
        "inactive",
        "failed",
    ]);
    let invocation =
        prop::sample::select(vec![OURS, THEIRS, "", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"]);
    let reading = prop_oneof![
        Just(CgroupReading::Populated),
        Just(CgroupReading::Empty),
        Just(CgroupReading::Gone),
        Just(CgroupReading::Unreadable("eio".into())),
    ];
    prop_oneof![
        4 => (active, invocation.clone()).prop_map(|(a, i)| st(a, i)),
        1 => (prop::sample::select(vec!["inactive", "failed"]), invocation)
            .prop_map(|(a, i)| starts(a, i)),
        4 => reading.prop_map(cg),
        1 => Just(stop()),
        1 => Just(Step::In(Input::StateUnknown)),
        1 => Just(Step::In(Input::ForeignStopFailed)),
        2 => (0u64..5000).prop_map(wait_ms),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn invariants_hold_over_random_facts(steps in prop::collection::vec(any_step(), 0..60)) {
        let start = Instant::now();
        let mut now = start;
        let mut proof = UnitProof::new(OURS.into());
        let mut last_reading: Option<CgroupReading> = None;
        let mut last_state: Option<UnitState> = None;
        let mut proven = 0;
        let mut foreign_stops = 0;
        let mut failed_stops = 0;
        let mut stop_requested = false;
        for step in steps {
            match step {
                Step::In(input) => {
                    match &input {
                        Input::Cgroup(r) => last_reading = Some(r.clone()),
                        Input::State(s) => last_state = Some(s.clone()),
                        Input::StateUnknown => last_state = None,
                        Input::ForeignStopFailed => failed_stops += 1,
                        Input::StopRequested => stop_requested = true,
                        Input::Rebooted | Input::Leftovers(_) => {}
                    }
                    proof.handle_input(input, now);
                }
                Step::Wait(d) => {
                    now += d;
                    proof.handle_timeout(now);
                }
            }
            if let Some(at) = proof.poll_timeout() {
                // Deadlines never go backwards: a timer is never armed in the past.
                prop_assert!(at >= now, "deadline {:?} before now {:?}", at - start, now - start);
            }
            while let Some(output) = proof.poll_output() {
                // Proven is final: nothing at all follows the proof.
                prop_assert_eq!(proven, 0, "output after the proof: {:?}", output);
                match output {
                    Output::Proven(p) => {
                        proven += 1;
                        if p.cause != Cause::ReplacedAfterStop {
                            // Never proven while the last cgroup read said populated (or could
                            // not be read).
                            prop_assert!(
                                matches!(last_reading, Some(CgroupReading::Empty | CgroupReading::Gone)),
                                "proven {:?} after reading {:?}", p.cause, last_reading
                            );
                        }
                        // Never proven without a known state.
                        prop_assert!(last_state.is_some());
                        if p.cause == Cause::Exited {
                            let s = last_state.as_ref().unwrap();
                            prop_assert!(s.invocation.is_empty() || s.invocation == OURS);
                            prop_assert!(s.is_over(), "proven exited from {:?}", s);
                        }
                    }
                    Output::StopUnit(StopReason::Foreign) => {
                        // A foreign stop never follows a stop of ours.
                        prop_assert!(!stop_requested);
                        foreign_stops += 1;
                    }
                    _ => {}
                }
            }
            // One foreign stop, and one again after each that failed.
            prop_assert!(foreign_stops <= 1 + failed_stops);
            prop_assert_eq!(proof.phase() == Phase::Proven, proven == 1);
        }
    }

    #[test]
    fn retry_deadlines_never_go_backwards(errors in 1usize..40, gaps in prop::collection::vec(0u64..3000, 40)) {
        let start = Instant::now();
        let mut now = start;
        let mut proof = UnitProof::new(OURS.into());
        proof.handle_input(Input::State(UnitState { active_state: "failed".into(), invocation: OURS.into(), starting: false }), now);
        let mut last_deadline = None;
        for gap in gaps.into_iter().take(errors) {
            proof.handle_input(Input::Cgroup(CgroupReading::Unreadable("eio".into())), now);
            let at = proof.poll_timeout().expect("a read error arms a retry");
            if let Some(prev) = last_deadline {
                prop_assert!(at >= prev);
            }
            prop_assert!(at > now && at <= now + RETRY_MAX);
            last_deadline = Some(at);
            now += Duration::from_millis(gap);
            proof.handle_timeout(now);
        }
    }
}
