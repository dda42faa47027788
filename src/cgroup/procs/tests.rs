use std::os::unix::fs::symlink;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use mio::{Events, Poll};
use nix::sys::wait::{Id, WaitPidFlag, waitid};
use proptest::prelude::*;

use mio::Token;
use nix::time::ClockId;

use super::start_order::{StartOrder, read_clock_ns};
use super::*;
use crate::cgroup::cgroup2_mount;

/// How long a test waits for the kernel before failing; generous, never a speed assertion.
const KERNEL_WAIT: Duration = Duration::from_secs(20);

/// A pid above the kernel's largest `pid_max` (2^22), so no process has it.
const NO_SUCH_PID: i32 = i32::MAX;

/// A real stat line (Linux 6.18), command name `sleep`.
const SLEEP_STAT: &[u8] = b"4242 (sleep) S 4200 4242 4200 34816 4242 4194304 96 0 0 0 0 0 0 0 \
20 0 1 0 21220 5652480 256 18446744073709551615 94768343896064 94768343910961 140736429416432 \
0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 94768343921360 94768343922528 94768377503744 140736429419747 \
140736429419758 140736429419758 140736429420523 0\n";

static NEXT_NAME: AtomicUsize = AtomicUsize::new(0);

fn unique_name() -> String {
    let n = NEXT_NAME.fetch_add(1, Ordering::Relaxed);
    format!("exitproof-procstest-{}-{n}", std::process::id())
}

/// `sleep` children that are killed and reaped on drop, even when a test fails.
#[derive(Default)]
struct Sleeps(Vec<Child>);

impl Sleeps {
    /// Starts `sleep 1000`; returns its pid.
    fn spawn(&mut self) -> i32 {
        let child = Command::new("sleep")
            .arg("1000")
            .spawn()
            .expect("sleep can be started");
        let pid = i32::try_from(child.id()).expect("pids fit in i32");
        self.0.push(child);
        pid
    }

    fn child(&mut self, pid: i32) -> &mut Child {
        self.0
            .iter_mut()
            .find(|child| child.id() as i32 == pid)
            .expect("a sleep of this test")
    }

    /// Sends SIGKILL without reaping: the process becomes a zombie.
    fn kill(&mut self, pid: i32) {
        self.child(pid).kill().expect("kill");
    }

    /// Kills, then waits until the process is a zombie, still unreaped.
    fn kill_to_zombie(&mut self, pid: i32) {
        self.kill(pid);
        waitid(
            Id::Pid(nix::unistd::Pid::from_raw(pid)),
            WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT,
        )
        .expect("waitid");
    }

    /// Kills and reaps.
    fn reap(&mut self, pid: i32) {
        let child = self.child(pid);
        let _ = child.kill();
        child.wait().expect("wait");
    }
}

impl Drop for Sleeps {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn start_ticks(pid: i32) -> u64 {
    read_stat(pid)
        .expect("stat is readable")
        .expect("the process exists")
        .start_ticks
}

/// A stat line with the given fields, the rest as a real kernel writes them.
fn stat_line(pid: i32, comm: &[u8], state: u8, ppid: i32, start: u64) -> Vec<u8> {
    let mut line = format!("{pid} (").into_bytes();
    line.extend_from_slice(comm);
    line.extend_from_slice(b") ");
    line.push(state);
    line.extend_from_slice(
        format!(" {ppid} 1 1 0 -1 4194560 100 0 0 0 1 2 0 0 20 -5 1 0 {start} 1000 10 18446744073709551615 1 2 3 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n")
            .as_bytes(),
    );
    line
}

#[test]
fn parse_stat_reads_a_real_line() {
    assert_eq!(
        parse_stat(SLEEP_STAT),
        Ok(ProcStat {
            pid: 4242,
            comm: b"sleep".to_vec(),
            state: 'S',
            ppid: 4200,
            session: 4200,
            start_ticks: 21220,
        })
    );
}

#[test]
fn parse_stat_takes_the_command_up_to_the_last_paren() {
    let comms: &[&[u8]] = &[
        b"",
        b"a b",
        b"(",
        b")",
        b"a) R 1 2 (b",
        b") S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99 ",
        b"new\nline",
        b"((()))",
        b"kworker/u8:3-events_unbound",
    ];
    for comm in comms {
        let line = stat_line(7, comm, b'R', 1, 1234);
        let stat = parse_stat(&line).expect("valid line");
        assert_eq!(stat.comm, *comm, "comm {:?}", lossy(comm));
        assert_eq!((stat.pid, stat.state, stat.ppid), (7, 'R', 1));
        assert_eq!(stat.start_ticks, 1234);
    }
}

#[test]
fn parse_stat_rejects_malformed_lines() {
    use StatParseError::*;
    let valid = stat_line(7, b"x", b'S', 1, 99);
    let text = String::from_utf8(valid.clone()).expect("ascii");
    let replace = |from: &str, to: &str| text.replacen(from, to, 1).into_bytes();
    // The first 22 fields of the valid line, then the rest cut off.
    let first_22: Vec<&str> = text.split(' ').take(22).collect();
    let cases: Vec<(Vec<u8>, StatParseError)> = vec![
        (b"".to_vec(), NoNewline),
        (valid[..valid.len() - 1].to_vec(), NoNewline),
        (b"\n".to_vec(), NoCommand),
        (b"7 x S 1\n".to_vec(), NoCommand),
        (b"7 )x( S 1\n".to_vec(), NoCommand),
        (replace("7 (", "07 ("), BadPid("07 ".into())),
        (replace("7 (", "0 ("), BadPid("0 ".into())),
        (replace("7 (", "-7 ("), BadPid("-7 ".into())),
        (replace("7 (", "+7 ("), BadPid("+7 ".into())),
        (replace("7 (", "7  ("), BadPid("7  ".into())),
        (replace("7 (", "7("), BadPid("7".into())),
        (replace("7 (", "2147483648 ("), BadPid("2147483648 ".into())),
        (replace(") S", ")S"), TooFewFields(0)),
        (b"7 (x)\n".to_vec(), TooFewFields(0)),
        (b"7 (x) S 1 1\n".to_vec(), TooFewFields(3)),
        (
            format!("{}\n", first_22[..21].join(" ")).into_bytes(),
            TooFewFields(19),
        ),
        (replace(") S", ") s1"), BadState("s1".into())),
        (replace(") S", ") 1"), BadState("1".into())),
        (replace(") S", ") "), BadState("".into())),
        (
            replace(" S 1 ", " S 01 "),
            BadField {
                field: 4,
                text: "01".into(),
            },
        ),
        (
            replace(" S 1 ", " S -1 "),
            BadField {
                field: 4,
                text: "-1".into(),
            },
        ),
        (
            replace(" S 1 ", " S 2147483648 "),
            BadField {
                field: 4,
                text: "2147483648".into(),
            },
        ),
        (
            replace(" S 1 ", " S  1 "),
            BadField {
                field: 4,
                text: "".into(),
            },
        ),
        (
            replace(" 99 ", " -99 "),
            BadField {
                field: 22,
                text: "-99".into(),
            },
        ),
        (
            replace(" 99 ", " 18446744073709551616 "),
            BadField {
                field: 22,
                text: "18446744073709551616".into(),
            },
        ),
        (
            replace(" 99 ", " 9x "),
            BadField {
                field: 22,
                text: "9x".into(),
            },
        ),
        (
            replace(" 0\n", " 0 \n"),
            BadField {
                field: 53,
                text: "".into(),
            },
        ),
        (
            replace(" 0\n", " 0\r\n"),
            BadField {
                field: 52,
                text: "0\r".into(),
            },
        ),
        (
            replace(" 0\n", " 0\n\n"),
            BadField {
                field: 52,
                text: "0\n".into(),
            },
        ),
    ];
    for (contents, expected) in cases {
        assert_eq!(
            parse_stat(&contents),
            Err(expected),
            "contents {:?}",
            lossy(&contents)
        );
    }
}

proptest! {
    #[test]
    fn parse_stat_never_panics(contents in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = parse_stat(&contents);
    }

    #[test]
    fn parse_stat_never_panics_near_valid_lines(
        comm in proptest::collection::vec(any::<u8>(), 0..80),
        cut in 0usize..300,
        flip in any::<u8>(),
    ) {
        let mut line = stat_line(7, &comm, b'S', 1, 99);
        let at = cut % line.len();
        line[at] = flip;
        let _ = parse_stat(&line);
        line.truncate(at);
        let _ = parse_stat(&line);
    }

    #[test]
    fn parse_stat_recovers_generated_lines(
        pid in 1..=i32::MAX,
        comm in proptest::collection::vec(any::<u8>(), 0..80),
        state in proptest::sample::select(b"RSDZTtXxKWPI".to_vec()),
        ppid in 0..=i32::MAX,
        start in any::<u64>(),
    ) {
        let line = stat_line(pid, &comm, state, ppid, start);
        let stat = parse_stat(&line).expect("a generated line is valid");
        prop_assert_eq!(stat, ProcStat {
            pid,
            comm,
            state: char::from(state),
            ppid,
            session: 1,
            start_ticks: start,
        });
    }

    #[test]
    fn parse_procs_never_panics(contents in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = parse_procs(&contents);
    }

    /// Whatever the true start within its tick and whatever the offset at the fork (at most the
    /// one read now), a certain answer is right.
    #[test]
    fn start_order_is_never_wrong_when_certain(
        clk_tck in 1u64..2000,
        start_ticks in 0u64..1_000_000_000,
        boot_minus_mono_ns in 0u64..10_000_000_000_000,
        threshold_mono_us in 0u64..20_000_000_000_000,
        within_tick in 0.0f64..1.0,
        offset_share in 0.0f64..=1.0,
    ) {
        let basis = ClockBasis { clk_tck, boot_minus_mono_ns, ..ClockBasis::default() };
        let order = basis.start_order(start_ticks, threshold_mono_us);
        let tick_ns = NANOS_PER_SEC as f64 / clk_tck as f64;
        let boot_ns = (start_ticks as f64 + within_tick) * tick_ns;
        let offset_then_ns = boot_minus_mono_ns as f64 * offset_share;
        let mono_ns = boot_ns - offset_then_ns;
        let threshold_ns = threshold_mono_us as f64 * 1000.0;
        // f64 cannot place points within a few ns of the threshold; those prove nothing here.
        prop_assume!((mono_ns - threshold_ns).abs() > 1e-6 * threshold_ns.max(1.0));
        match order {
            StartOrder::AtOrAfter => prop_assert!(mono_ns >= threshold_ns),
            StartOrder::Before => prop_assert!(mono_ns < threshold_ns),
            StartOrder::Uncertain => {}
        }
    }

    /// One suspend of `suspended_ms` at `suspend_at_ms` (CLOCK_MONOTONIC), a fork at
    /// `fork_ms`, the driver's readings at `readings_ms`: with the floors those readings
    /// noted, a certain answer is still right.
    #[test]
    fn start_order_with_floors_is_never_wrong_when_certain(
        suspend_at_ms in 0u64..100_000,
        suspended_ms in 0u64..100_000,
        fork_ms in 0u64..200_000,
        threshold_ms in 0u64..200_000,
        readings_ms in proptest::collection::vec(0u64..200_000, 0..6),
    ) {
        let offset_at = |ms: u64| if ms >= suspend_at_ms { suspended_ms * 1_000_000 } else { 0 };
        let mut readings = readings_ms;
        readings.sort_unstable();
        let mut floors = OffsetFloors::default();
        for at in &readings {
            floors.note(at * 1000, offset_at(*at));
        }
        let now_ms = readings.last().copied().unwrap_or(0).max(fork_ms).max(suspend_at_ms);
        let basis = ClockBasis {
            clk_tck: 100,
            boot_minus_mono_ns: offset_at(now_ms),
            floors,
        };
        let start_ticks = (fork_ms * 1_000_000 + offset_at(fork_ms)) / 10_000_000;
        match basis.start_order(start_ticks, threshold_ms * 1000) {
            StartOrder::AtOrAfter => prop_assert!(fork_ms >= threshold_ms),
            StartOrder::Before => prop_assert!(fork_ms < threshold_ms),
            StartOrder::Uncertain => {}
        }
    }
}

/// Floors are saved as pairs and taken up again by an agent started again in the same boot.
#[test]
fn floors_taken_up_from_their_pairs_are_the_floors_saved() {
    let mut floors = OffsetFloors::default();
    assert!(!floors.note(1_000_000, 0), "a floor of 0 bounds nothing");
    assert!(floors.note(15_000_000, 40_000_000_000));
    assert!(!floors.note(16_000_000, 40_000_000_000), "no higher");
    assert_eq!(OffsetFloors::from_pairs(floors.pairs()), floors);
    // Pairs that do not rise (a file edited by hand) are skipped.
    let edited = OffsetFloors::from_pairs(&[(20_000_000, 5), (10_000_000, 9)]);
    assert_eq!(edited.pairs(), &[(20_000_000, 5)]);
}

/// A start after a suspend, against an invocation that began after the suspend too: with a
/// reading of the offset since the suspend, before the invocation began, the start is placed
/// before it; without one it is uncertain (it may have come before the suspend).
#[test]
fn a_reading_after_a_suspend_places_a_start_before_a_later_threshold() {
    // Suspended 40 s at 10 s; forked at 20 s (boottime 60 s), the invocation began at 30 s.
    let mut floors = OffsetFloors::default();
    floors.note(15_000_000, 40_000_000_000);
    let basis = ClockBasis {
        clk_tck: 100,
        boot_minus_mono_ns: 40_000_000_000,
        floors,
    };
    assert_eq!(basis.start_order(6_000, 30_000_000), StartOrder::Before);
    let unseen = ClockBasis {
        floors: OffsetFloors::default(),
        ..basis
    };
    assert_eq!(unseen.start_order(6_000, 30_000_000), StartOrder::Uncertain);
    // A reading after the threshold bounds nothing at it.
    let mut late = OffsetFloors::default();
    late.note(31_000_000, 40_000_000_000);
    let read_late = ClockBasis {
        floors: late,
        ..basis
    };
    assert_eq!(
        read_late.start_order(6_000, 30_000_000),
        StartOrder::Uncertain
    );
}

#[test]
fn parse_procs_accepts_only_pid_lines() {
    use ProcsParseError::*;
    type Case = (&'static [u8], Result<Vec<i32>, ProcsParseError>);
    let cases: &[Case] = &[
        (b"", Ok(vec![])),
        (b"1\n", Ok(vec![1])),
        (b"12\n3\n2147483647\n", Ok(vec![12, 3, 2147483647])),
        (b"1", Err(NoNewline)),
        (b"1\n2", Err(NoNewline)),
        (b"\n", Err(BadPid("".into()))),
        (b"1\n\n2\n", Err(BadPid("".into()))),
        (b"0\n", Err(BadPid("0".into()))),
        (b"01\n", Err(BadPid("01".into()))),
        (b"-1\n", Err(BadPid("-1".into()))),
        (b" 1\n", Err(BadPid(" 1".into()))),
        (b"1\r\n", Err(BadPid("1\r".into()))),
        (b"2147483648\n", Err(BadPid("2147483648".into()))),
    ];
    for (contents, expected) in cases {
        assert_eq!(
            &parse_procs(contents),
            expected,
            "contents {:?}",
            lossy(contents)
        );
    }
}

#[test]
fn start_order_boundaries() {
    use StartOrder::*;
    // 100 ticks/s: tick 100 covers boottime [1 s, 1.01 s).
    let no_suspend = ClockBasis {
        clk_tck: 100,
        boot_minus_mono_ns: 0,
        ..ClockBasis::default()
    };
    let cases = [
        (100, 999_999, AtOrAfter),
        (100, 1_000_000, AtOrAfter),
        (100, 1_000_001, Uncertain),
        (100, 1_009_999, Uncertain),
        (100, 1_010_000, Before),
        (100, 1_010_001, Before),
        (0, 0, AtOrAfter),
        (0, 1, Uncertain),
        (0, 10_000, Before),
    ];
    for (ticks, threshold, expected) in cases {
        assert_eq!(
            no_suspend.start_order(ticks, threshold),
            expected,
            "ticks {ticks}, threshold {threshold} us"
        );
    }

    // 5 ms suspended so far: the start may be up to 5 ms earlier on CLOCK_MONOTONIC, no later.
    let suspended = ClockBasis {
        clk_tck: 100,
        boot_minus_mono_ns: 5_000_000,
        ..ClockBasis::default()
    };
    let cases = [
        (100, 995_000, AtOrAfter),
        (100, 995_001, Uncertain),
        (100, 1_000_000, Uncertain),
        (100, 1_009_999, Uncertain),
        (100, 1_010_000, Before),
        // An offset larger than the start itself: the earliest start is 0.
        (0, 0, AtOrAfter),
        (0, 1, Uncertain),
    ];
    for (ticks, threshold, expected) in cases {
        assert_eq!(
            suspended.start_order(ticks, threshold),
            expected,
            "ticks {ticks}, threshold {threshold} us, suspended"
        );
    }

    // 3 ticks/s: tick 1 covers [333_333_333.3, 666_666_666.7) ns; rounding widens it.
    let odd = ClockBasis {
        clk_tck: 3,
        boot_minus_mono_ns: 0,
        ..ClockBasis::default()
    };
    assert_eq!(odd.start_order(1, 333_333), AtOrAfter);
    assert_eq!(odd.start_order(1, 333_334), Uncertain);
    assert_eq!(odd.start_order(1, 666_666), Uncertain);
    assert_eq!(odd.start_order(1, 666_667), Before);

    let broken = ClockBasis {
        clk_tck: 0,
        boot_minus_mono_ns: 0,
        ..ClockBasis::default()
    };
    assert_eq!(broken.start_order(100, 0), Uncertain);

    let extreme = ClockBasis {
        clk_tck: 1,
        boot_minus_mono_ns: u64::MAX,
        ..ClockBasis::default()
    };
    assert_eq!(extreme.start_order(u64::MAX, u64::MAX), AtOrAfter);
    assert_eq!(extreme.start_order(1, 0), AtOrAfter);
    assert_eq!(extreme.start_order(1, 1), Uncertain);
    assert_eq!(no_suspend.start_order(u64::MAX, 0), AtOrAfter);
    assert_eq!(no_suspend.start_order(0, u64::MAX), Before);

    assert!(Before.counts_as_before());
    assert!(Uncertain.counts_as_before());
    assert!(!AtOrAfter.counts_as_before());
}

#[test]
fn clocks_can_be_read() {
    let basis = ClockBasis::now(OffsetFloors::default()).expect("clocks");
    assert!(basis.clk_tck > 0);
    // This process started before now, whatever the offset.
    let boot_now_ns = read_clock_ns(ClockId::CLOCK_BOOTTIME, "CLOCK_BOOTTIME").expect("clock");
    let mono_now_us =
        read_clock_ns(ClockId::CLOCK_MONOTONIC, "CLOCK_MONOTONIC").expect("clock") / 1000;
    let own = start_ticks(std::process::id() as i32);
    let own_boot_ns = i128::from(own) * 1_000_000_000 / i128::from(basis.clk_tck);
    assert!(
        own_boot_ns <= boot_now_ns,
        "start time is on CLOCK_BOOTTIME"
    );
    let mono_now_us = u64::try_from(mono_now_us).expect("positive");
    assert!(
        basis
            .start_order(own, mono_now_us + 20_000)
            .counts_as_before()
    );
}

#[test]
fn read_stat_reads_own_and_skips_missing() {
    let own = std::process::id() as i32;
    let stat = read_stat(own).expect("own stat").expect("own process");
    assert_eq!(stat.pid, own);
    assert_eq!(stat.ppid, nix::unistd::getppid().as_raw());
    assert!(read_stat(NO_SUCH_PID).expect("no error").is_none());
}

/// A temporary directory laid out like a cgroup tree; removed on drop.
struct FakeTree(tempfile::TempDir);

impl FakeTree {
    fn new() -> Self {
        Self(tempfile::tempdir().expect("temporary directory"))
    }

    fn root(&self) -> &Path {
        self.0.path()
    }

    /// Creates the cgroup directory `cgroup` (below the root) with `cgroup.procs` holding `procs`.
    fn cgroup(&self, cgroup: &str, procs: &[u8]) {
        let dir = self.root().join(cgroup);
        fs::create_dir_all(&dir).expect("mkdir");
        fs::write(dir.join(PROCS_FILE), procs).expect("write cgroup.procs");
    }
}

fn pids_of(found: &[ProcessInfo]) -> Vec<(i32, String)> {
    let mut pids: Vec<(i32, String)> = found
        .iter()
        .map(|info| (info.pid, info.cgroup.display().to_string()))
        .collect();
    pids.sort();
    pids
}

#[test]
fn list_processes_walks_a_fake_tree() {
    let mut sleeps = Sleeps::default();
    let child = sleeps.spawn();
    let hidden = sleeps.spawn();
    let own = std::process::id() as i32;
    let tree = FakeTree::new();
    tree.cgroup(
        "u.slice/x.service",
        format!("{own}\n{NO_SUCH_PID}\n").as_bytes(),
    );
    tree.cgroup("u.slice/x.service/a", format!("{child}\n").as_bytes());
    // Listed twice: reported once.
    tree.cgroup("u.slice/x.service/a/b", format!("{own}\n").as_bytes());
    tree.cgroup("u.slice/x.service/a/b/c", b"");
    // Not followed: a link is no cgroup.
    tree.cgroup("elsewhere", format!("{hidden}\n").as_bytes());
    symlink(
        tree.root().join("elsewhere"),
        tree.root().join("u.slice/x.service/link"),
    )
    .expect("symlink");
    // Files other than cgroup.procs are ignored.
    fs::write(tree.root().join("u.slice/x.service/cgroup.events"), "").expect("write");

    let census = list_processes(tree.root(), "/u.slice/x.service").expect("list");
    assert_eq!(census.vanished, 1, "pid {NO_SUCH_PID} was listed, and gone");
    let found = census.processes;
    let mut expected = vec![(own, String::new()), (child, "a".to_owned())];
    expected.sort();
    assert_eq!(pids_of(&found), expected);
    let sleep = found
        .iter()
        .find(|info| info.pid == child)
        .expect("the sleep");
    assert_eq!(sleep.comm, b"sleep");
    assert_eq!(sleep.ppid, own);
    assert_eq!(sleep.start_ticks, start_ticks(child));

    assert_eq!(
        list_processes(tree.root(), "/u.slice/missing.service").expect("list"),
        Census::default(),
        "a unit cgroup that does not exist holds nothing"
    );
}

#[test]
fn list_processes_reports_errors_with_the_path() {
    let tree = FakeTree::new();
    tree.cgroup("bad.service", b"1\nx\n");
    fs::create_dir_all(tree.root().join("nofile.service")).expect("mkdir");
    tree.cgroup("nested.service", b"");
    fs::create_dir_all(tree.root().join("nested.service/not-a-cgroup")).expect("mkdir");
    tree.cgroup("huge.service", &vec![b'1'; MAX_PROCS_FILE_BYTES + 1]);

    let error = list_processes(tree.root(), "/bad.service").expect_err("bad pid");
    assert!(matches!(&error, ProcsError::ProcsParse { .. }), "{error:?}");
    let path = tree.root().join("bad.service/cgroup.procs");
    assert!(
        error.to_string().contains(&path.display().to_string()),
        "{error}"
    );

    for (cgroup, missing) in [
        ("/nofile.service", "nofile.service/cgroup.procs"),
        (
            "/nested.service",
            "nested.service/not-a-cgroup/cgroup.procs",
        ),
    ] {
        match list_processes(tree.root(), cgroup) {
            Err(ProcsError::ReadFile { path, .. }) => {
                assert_eq!(path, tree.root().join(missing))
            }
            other => panic!("{cgroup} gave {other:?}"),
        }
    }
    match list_processes(tree.root(), "/huge.service") {
        Err(ProcsError::FileTooLarge { path, .. }) => {
            assert_eq!(path, tree.root().join("huge.service/cgroup.procs"))
        }
        other => panic!("huge gave {other:?}"),
    }

    for cgroup in ["", "x.service", "/", "/a/../b", "/a\0b", "/a//b"] {
        match list_processes(tree.root(), cgroup) {
            Err(ProcsError::Cgroup(CgroupError::InvalidCgroup { .. })) => {}
            other => panic!("cgroup {cgroup:?} gave {other:?}"),
        }
    }
}

#[test]
fn walk_stops_at_its_limits() {
    let tree = FakeTree::new();
    tree.cgroup("unit", b"");
    tree.cgroup("unit/a", b"");
    tree.cgroup("unit/a/b", b"");
    tree.cgroup("wide", b"1\n");
    tree.cgroup("wide/a", b"2\n1\n");
    tree.cgroup("wide/b", b"3\n");
    let top = tree.root().join("unit");
    let limits = |depth, cgroups, processes| WalkLimits {
        depth,
        cgroups,
        processes,
    };

    assert!(walk(&top, limits(2, 3, 0)).is_ok(), "exactly at the limits");
    match walk(&top, limits(1, 10, 10)) {
        Err(ProcsError::TooDeep { path, limit: 1 }) => assert_eq!(path, top.join("a/b")),
        other => panic!("depth gave {other:?}"),
    }
    match walk(&top, limits(10, 2, 10)) {
        Err(ProcsError::TooManyCgroups { path, limit: 2 }) => assert_eq!(path, top),
        other => panic!("cgroups gave {other:?}"),
    }

    // Pids 1, 2, 3, with 1 listed twice; which of them exist does not matter to the count.
    let wide = tree.root().join("wide");
    assert!(
        walk(&wide, limits(10, 10, 3)).is_ok(),
        "a repeated pid counts once"
    );
    match walk(&wide, limits(10, 10, 2)) {
        Err(ProcsError::TooManyProcesses { path, limit: 2 }) => assert_eq!(path, wide),
        other => panic!("processes gave {other:?}"),
    }
}

/// Polls until the tracker reports at least one exit; panics after [`KERNEL_WAIT`].
fn wait_for_exits(poll: &mut Poll, tracker: &mut ProcessTracker<u32>) -> Vec<(u32, i32)> {
    let mut events = Events::with_capacity(16);
    let deadline = Instant::now() + KERNEL_WAIT;
    loop {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            panic!("timed out waiting for an exit");
        };
        poll.poll(&mut events, Some(left)).expect("mio poll");
        let exits: Vec<(u32, i32)> = events
            .iter()
            .map(|event| event.token())
            .filter(|&token| tracker.owns(token))
            .collect::<Vec<Token>>()
            .into_iter()
            .filter_map(|token| tracker.handle_event(poll.registry(), token))
            .collect();
        if !exits.is_empty() {
            return exits;
        }
    }
}

fn token_of(tracker: &ProcessTracker<u32>, key: u32, pid: i32) -> Token {
    tracker.token_of(key, pid)
}

#[test]
fn tracker_reports_exactly_the_exit_that_happened() {
    let mut poll = Poll::new().expect("mio poll");
    let mut tracker = ProcessTracker::new(100..200);
    let mut sleeps = Sleeps::default();
    let first = sleeps.spawn();
    let second = sleeps.spawn();
    let other_key = sleeps.spawn();
    for (key, pid) in [(1, first), (1, second), (2, other_key)] {
        let tracked = tracker
            .track(poll.registry(), key, pid, start_ticks(pid))
            .expect("track");
        assert_eq!(tracked, Tracked::Alive);
    }
    // The same (key, pid) again changes nothing.
    assert_eq!(
        tracker
            .track(poll.registry(), 1, first, start_ticks(first))
            .expect("track"),
        Tracked::Alive
    );
    assert_eq!(tracker.tracked_count(1), 2);
    assert_eq!(tracker.len(), 3);

    // A readiness event for a live process is no exit.
    let token = token_of(&tracker, 1, second);
    assert!(tracker.owns(token));
    assert_eq!(tracker.handle_event(poll.registry(), token), None);
    assert_eq!(tracker.tracked_count(1), 2);
    assert_eq!(tracker.handle_event(poll.registry(), Token(150)), None);
    assert!(!tracker.owns(Token(200)));

    sleeps.kill(first);
    assert_eq!(wait_for_exits(&mut poll, &mut tracker), [(1, first)]);
    let mut left: Vec<i32> = tracker.tracked(1).collect();
    left.sort();
    assert_eq!(left, [second]);
    sleeps.reap(first);

    // A zombie is an exit, and so is a reaped process.
    sleeps.kill_to_zombie(second);
    assert_eq!(wait_for_exits(&mut poll, &mut tracker), [(1, second)]);
    assert_eq!(tracker.tracked_count(1), 0);

    tracker.untrack_key(poll.registry(), 2);
    assert!(tracker.is_empty());
    assert_eq!(tracker.tracked_count(2), 0);
}

#[test]
fn tracking_a_gone_process_says_so() {
    let poll = Poll::new().expect("mio poll");
    let mut tracker = ProcessTracker::new(0..10);
    let mut sleeps = Sleeps::default();

    let reaped = sleeps.spawn();
    let ticks = start_ticks(reaped);
    sleeps.reap(reaped);
    // The pid may have been reused since: that too is the original's exit.
    assert_eq!(
        tracker
            .track(poll.registry(), 1, reaped, ticks)
            .expect("track"),
        Tracked::AlreadyExited
    );

    let zombie = sleeps.spawn();
    let ticks = start_ticks(zombie);
    sleeps.kill_to_zombie(zombie);
    assert_eq!(
        tracker
            .track(poll.registry(), 1, zombie, ticks)
            .expect("track"),
        Tracked::AlreadyExited
    );

    let alive = sleeps.spawn();
    let ticks = start_ticks(alive);
    assert_eq!(
        tracker
            .track(poll.registry(), 1, alive, ticks + 1)
            .expect("track"),
        Tracked::AlreadyExited,
        "another start time is another process"
    );
    assert_eq!(
        tracker
            .track(poll.registry(), 1, NO_SUCH_PID, 0)
            .expect("track"),
        Tracked::AlreadyExited
    );
    assert!(tracker.is_empty());

    for pid in [0, -1, i32::MIN] {
        assert!(matches!(
            tracker.track(poll.registry(), 1, pid, 0),
            Err(ProcsError::InvalidPid { .. })
        ));
    }
}

#[test]
fn tracker_tokens_stay_in_range_and_are_reused() {
    let mut poll = Poll::new().expect("mio poll");
    let mut tracker = ProcessTracker::new(7..8);
    let mut sleeps = Sleeps::default();
    let first = sleeps.spawn();
    let second = sleeps.spawn();
    tracker
        .track(poll.registry(), 1, first, start_ticks(first))
        .expect("track");
    assert_eq!(token_of(&tracker, 1, first), Token(7));
    assert!(matches!(
        tracker.track(poll.registry(), 1, second, start_ticks(second)),
        Err(ProcsError::NoToken { .. })
    ));
    sleeps.kill(first);
    assert_eq!(wait_for_exits(&mut poll, &mut tracker), [(1, first)]);
    assert_eq!(
        tracker
            .track(poll.registry(), 1, second, start_ticks(second))
            .expect("track"),
        Tracked::Alive
    );
    assert_eq!(token_of(&tracker, 1, second), Token(7));
    tracker.untrack_key(poll.registry(), 1);
    assert!(tracker.is_empty());
}

/// A scratch cgroup tree below the real cgroup2 mount. Dropping it kills what is in it, reaps the
/// test's sleeps and removes the cgroups deepest first, even when the test failed.
struct ScratchCgroup {
    mount: PathBuf,
    name: String,
    /// Child cgroups created, in creation order.
    children: Vec<String>,
    sleeps: Sleeps,
}

impl ScratchCgroup {
    /// `None`, with the reason printed, unless this test may create cgroups.
    fn new() -> Option<Self> {
        if !nix::unistd::geteuid().is_root() {
            println!("skipped: creating cgroups needs root");
            return None;
        }
        let mount = match cgroup2_mount() {
            Ok(mount) => mount,
            Err(error) => {
                println!("skipped: {error}");
                return None;
            }
        };
        let name = unique_name();
        if let Err(error) = fs::create_dir(mount.join(&name)) {
            println!(
                "skipped: cgroup2 at {} is not writable: {error}",
                mount.display()
            );
            return None;
        }
        Some(Self {
            mount,
            name,
            children: Vec::new(),
            sleeps: Sleeps::default(),
        })
    }

    fn dir(&self) -> PathBuf {
        self.mount.join(&self.name)
    }

    fn mkdir(&mut self, child: &str) {
        fs::create_dir(self.dir().join(child)).expect("mkdir of a scratch cgroup");
        self.children.push(child.to_owned());
    }

    /// Starts a sleep and moves it into `child` (empty: the scratch cgroup itself).
    fn spawn_sleep_in(&mut self, child: &str) -> i32 {
        let pid = self.sleeps.spawn();
        fs::write(self.dir().join(child).join(PROCS_FILE), pid.to_string())
            .expect("a pid can be moved into a scratch cgroup");
        pid
    }
}

impl Drop for ScratchCgroup {
    fn drop(&mut self) {
        let _ = fs::write(self.dir().join("cgroup.kill"), "1");
        for child in &mut self.sleeps.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
        let dirs = self
            .children
            .iter()
            .rev()
            .map(|child| self.dir().join(child));
        for dir in dirs.chain([self.dir()]) {
            // A killed process not of ours may take a moment to leave; rmdir says EBUSY until then.
            let deadline = Instant::now() + KERNEL_WAIT;
            while let Err(error) = fs::remove_dir(&dir) {
                if error.raw_os_error() != Some(Errno::EBUSY as i32) || Instant::now() > deadline {
                    eprintln!("cannot remove scratch cgroup {}: {error}", dir.display());
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

#[test]
fn list_processes_finds_a_real_subtree() {
    let Some(mut scratch) = ScratchCgroup::new() else {
        return;
    };
    scratch.mkdir("a");
    scratch.mkdir("a/b");
    let top = scratch.spawn_sleep_in("");
    let middle = scratch.spawn_sleep_in("a");
    let deep = scratch.spawn_sleep_in("a/b");

    let cgroup = format!("/{}", scratch.name);
    let found = list_processes(&scratch.mount, &cgroup)
        .expect("list")
        .processes;
    let mut expected = vec![
        (top, String::new()),
        (middle, "a".to_owned()),
        (deep, "a/b".to_owned()),
    ];
    expected.sort();
    assert_eq!(pids_of(&found), expected);
    for info in &found {
        assert_eq!(info.comm, b"sleep");
        assert_eq!(info.start_ticks, start_ticks(info.pid));
    }

    // The tracker sees the deepest one go.
    let mut poll = Poll::new().expect("mio poll");
    let mut tracker = ProcessTracker::new(0..16);
    for info in &found {
        assert_eq!(
            tracker
                .track(poll.registry(), 9, info.pid, info.start_ticks)
                .expect("track"),
            Tracked::Alive
        );
    }
    scratch.sleeps.reap(deep);
    assert_eq!(wait_for_exits(&mut poll, &mut tracker), [(9, deep)]);
    let after = list_processes(&scratch.mount, &cgroup)
        .expect("list again")
        .processes;
    expected.retain(|(pid, _)| *pid != deep);
    assert_eq!(pids_of(&after), expected);
    tracker.untrack_key(poll.registry(), 9);
}

#[test]
fn list_processes_reads_threaded_subtrees_through_their_domain() {
    let Some(mut scratch) = ScratchCgroup::new() else {
        return;
    };
    scratch.mkdir("t");
    fs::write(scratch.dir().join("t/cgroup.type"), "threaded").expect("make t threaded");
    let pid = scratch.spawn_sleep_in("t");
    let cgroup = format!("/{}", scratch.name);
    let found = list_processes(&scratch.mount, &cgroup).expect("list");
    assert_eq!(pids_of(&found.processes), [(pid, String::new())]);
    match list_processes(&scratch.mount, &format!("{cgroup}/t")) {
        Err(ProcsError::Threaded { path }) => assert_eq!(path, scratch.dir().join("t")),
        other => panic!("a threaded unit cgroup gave {other:?}"),
    }
}

/// A process of a census: `pid`, its parent, its session, and its start in ticks (100 a
/// second, so tick 500 is 5 s).
fn process(pid: i32, ppid: i32, session: i32, start_ticks: u64) -> ProcessInfo {
    ProcessInfo {
        pid,
        ppid,
        session,
        start_ticks,
        comm: b"sleep".to_vec(),
        state: 'S',
        cgroup: std::path::PathBuf::new(),
    }
}

/// The pids `earlier_processes` keeps, `held` being processes of the census an earlier count
/// held.
fn earlier_pids(census: &[ProcessInfo], next: &NextInvocation, held: &[i32]) -> Vec<i32> {
    let held: Vec<ProcessStart> = held
        .iter()
        .map(|&pid| {
            let process = census
                .iter()
                .find(|p| p.pid == pid)
                .expect("held in the census");
            ProcessStart {
                pid,
                start_ticks: process.start_ticks,
                held_as: None,
            }
        })
        .collect();
    earlier_pids_holding(census, next, &held)
}

/// As [`earlier_pids`], with `held` as an earlier count saw it (some may be gone now).
fn earlier_pids_holding(
    census: &[ProcessInfo],
    next: &NextInvocation,
    held: &[ProcessStart],
) -> Vec<i32> {
    let basis = ClockBasis {
        clk_tck: 100,
        boot_minus_mono_ns: 0,
        ..ClockBasis::default()
    };
    earlier_processes(census, next, &basis, held)
        .into_iter()
        .map(|p| p.pid)
        .collect()
}

/// The next invocation began at 5 s; its ExecStartPre= (pid 50, gone now) began session 50.
fn next_with_gone_root() -> NextInvocation {
    NextInvocation {
        began_us: Some(5_000_000),
        roots_began_us: Some(5_000_000),
        roots: vec![],
        gone_roots: vec![GoneRoot {
            pid: 50,
            began_us: Some(5_000_000),
        }],
        once_held: OnceHeld::None,
        counted_roots: vec![],
    }
}

/// Our MainPID, a Type=forking daemon (pid 50), outlived our stop; systemd guessed it as the
/// next invocation's MainPID (`unit_search_main_pid`), and it forked a child (60) into its
/// session after that invocation began, then exited, before any count saw its start. Systemd
/// had named 50 our root too: the guess is told by that, and its child is ours (found by the
/// simulator, 233102442500749: proven `replaced-after-stop` with the child alive).
#[test]
fn a_child_of_our_root_that_systemd_named_again_for_the_next_invocation_is_ours() {
    let child = process(60, 1, 50, 600);
    let mut next = next_with_gone_root();
    assert_eq!(
        earlier_pids(std::slice::from_ref(&child), &next, &[]),
        Vec::<i32>::new(),
        "without our roots, the child counts as the next invocation's"
    );
    next.note_counted_roots(&[50]);
    assert_eq!(earlier_pids(std::slice::from_ref(&child), &next, &[]), [60]);
}

/// Our ExecCondition= (pid 50, a root systemd named for our invocation) forked a daemon (55)
/// that outlived our stop; the next invocation began 15 ms after that daemon started, and
/// systemd guessed it as its MainPID (`unit_search_main_pid`), while the agent heard no root
/// of that invocation before it. Its session tells it is ours, however close its start (found
/// by the simulator, 191867342476877: proven `replaced-after-stop` with the daemon alive).
#[test]
fn a_root_in_the_session_of_our_root_is_ours_however_late_it_started() {
    let daemon = process(55, 1, 50, 498);
    let mut next = NextInvocation {
        began_us: Some(5_000_000),
        roots_began_us: Some(5_000_000),
        roots: vec![55],
        ..NextInvocation::default()
    };
    assert_eq!(
        earlier_pids(std::slice::from_ref(&daemon), &next, &[]),
        [55],
        "without our roots, a root in a session no root of its invocation began is a guess"
    );
    next.note_counted_roots(&[50]);
    assert_eq!(
        earlier_pids(std::slice::from_ref(&daemon), &next, &[]),
        [55]
    );
    next.counted_roots = vec![51];
    next.gone_roots = vec![GoneRoot {
        pid: 50,
        began_us: Some(5_000_000),
    }];
    assert_eq!(
        earlier_pids(&[daemon], &next, &[]),
        Vec::<i32>::new(),
        "in a session a root of its own invocation began, and no root of ours"
    );
}

#[test]
fn an_orphan_in_the_session_of_a_gone_root_of_the_next_invocation_is_not_ours() {
    // Orphaned (parent 1), its session's leader gone: without the gone root it would be
    // counted as possibly ours, an orphaned child of a leftover of ours.
    let orphan = process(60, 1, 50, 600);
    let next = next_with_gone_root();
    assert_eq!(
        earlier_pids(std::slice::from_ref(&orphan), &next, &[]),
        Vec::<i32>::new()
    );
    let unknown = NextInvocation {
        gone_roots: vec![],
        ..next_with_gone_root()
    };
    assert_eq!(earlier_pids(&[orphan], &unknown, &[]), [60]);
}

#[test]
fn a_gone_root_frees_what_an_earlier_count_held_for_want_of_it() {
    let orphan = process(60, 1, 50, 600);
    assert_eq!(
        earlier_pids(&[orphan], &next_with_gone_root(), &[60]),
        Vec::<i32>::new()
    );
}

/// The processes of `census` as a count holds them, each where that count found it.
fn held_where_found(census: &[ProcessInfo]) -> Vec<ProcessStart> {
    census.iter().map(|p| held_in(p, census)).collect()
}

/// `process` as a count of `census` holds it.
fn held_in(process: &ProcessInfo, census: &[ProcessInfo]) -> ProcessStart {
    let listed = census.iter().map(|p| p.pid).collect();
    ProcessStart::held_in(process, &listed)
}

/// A count made while no beginning of a later invocation was known held every process; then
/// the next invocation's beginning (5 s) was told. A daemon of it (pid 64, a session of its
/// own, its parent the manager) and its children, all started after 5 s and still where they
/// were held, are judged by that now: not ours (found by the simulator, 110974389571932: they
/// waited as ours, held for good for want of the beginning).
#[test]
fn what_a_count_held_for_want_of_a_beginning_is_judged_by_it_once_told() {
    let census = [
        process(64, 1, 64, 600),
        process(66, 64, 64, 601),
        process(67, 64, 64, 605),
    ];
    let unknown = NextInvocation {
        began_us: None,
        roots_began_us: None,
        gone_roots: vec![],
        ..next_with_gone_root()
    };
    assert_eq!(earlier_pids_holding(&census, &unknown, &[]), [64, 66, 67]);
    let held = held_where_found(&census);
    assert_eq!(
        earlier_pids_holding(&census, &next_with_gone_root(), &held),
        Vec::<i32>::new()
    );
    // Held with no place known (an older count's answer): held still.
    let starts: Vec<ProcessStart> = held
        .iter()
        .map(|p| ProcessStart {
            held_as: None,
            ..*p
        })
        .collect();
    assert_eq!(
        earlier_pids_holding(&census, &next_with_gone_root(), &starts),
        [64, 66, 67]
    );
}

/// Our leftover (pid 40, started at 1 s) forked 41 after the next invocation began (6 s), which
/// began a session of its own; a count held both. Once 40 is gone, 41 (its parent the manager
/// now) is where no count would hold it, but it was held where its parent showed it ours: held
/// still, whether that count knew the beginning or not. So is a child that began a session of
/// its own after it was held.
#[test]
fn a_child_held_under_our_leftover_stays_held_once_its_parent_is_gone() {
    let then = [process(40, 1, 40, 100), process(41, 40, 41, 600)];
    let held = held_where_found(&then);
    let orphaned = [process(41, 1, 41, 600)];
    assert_eq!(
        earlier_pids_holding(&orphaned, &next_with_gone_root(), &[]),
        Vec::<i32>::new(),
        "never held, it is the documented gap"
    );
    assert_eq!(
        earlier_pids_holding(&orphaned, &next_with_gone_root(), &held),
        [41]
    );
    // 41 held in session 30, whose leader is gone and was never told (its parent 35, of the
    // next invocation by its start, began a session of its own since).
    let then = [process(35, 1, 35, 550), process(41, 35, 30, 600)];
    assert_eq!(
        earlier_pids_holding(&then, &next_with_gone_root(), &[]),
        [41]
    );
    let held = [held_in(&then[1], &then)];
    let own_session = [process(35, 1, 35, 550), process(41, 35, 41, 600)];
    assert_eq!(
        earlier_pids_holding(&own_session, &next_with_gone_root(), &[]),
        Vec::<i32>::new()
    );
    assert_eq!(
        earlier_pids_holding(&own_session, &next_with_gone_root(), &held),
        [41]
    );
}

#[test]
fn a_gone_roots_session_does_not_outweigh_an_older_parent() {
    // Pid 70 started at 1 s, before the next invocation: what it forks is a leftover too,
    // whatever session it is in.
    let census = [process(70, 1, 70, 100), process(71, 70, 50, 600)];
    assert_eq!(earlier_pids(&census, &next_with_gone_root(), &[]), [70, 71]);
}

#[test]
fn a_child_of_a_member_of_a_gone_roots_session_is_not_ours() {
    // Pid 60 is in the session of the gone root 50, of an invocation in between whose
    // beginning is unknown, so a later invocation's, though it started (at 1 s) before the
    // latest beginning known: its child 61 is not a leftover of ours either.
    let census = [process(60, 1, 50, 100), process(61, 60, 50, 600)];
    let next = NextInvocation {
        gone_roots: vec![GoneRoot {
            pid: 50,
            began_us: None,
        }],
        ..next_with_gone_root()
    };
    assert_eq!(earlier_pids(&census, &next, &[]), Vec::<i32>::new());
}

/// systemd guessed an earlier invocation's orphan (pid 50, leading session 50) as the next
/// invocation's MainPID (`unit_search_main_pid`), then it died: a member of its session that
/// started before the next invocation could fork is no member of a session that invocation
/// began, so it stays possibly ours.
#[test]
fn a_member_of_a_gone_roots_session_older_than_its_invocation_is_ours() {
    let census = [process(60, 1, 50, 100), process(61, 60, 50, 600)];
    assert_eq!(earlier_pids(&census, &next_with_gone_root(), &[]), [60, 61]);
    // Within the slack before the stamp of the beginning, it is the invocation's.
    let forked_first = [process(60, 1, 50, 499)];
    assert_eq!(
        earlier_pids(&forked_first, &next_with_gone_root(), &[]),
        Vec::<i32>::new()
    );
}

#[test]
fn a_process_whose_pid_was_a_gone_root_is_not_taken_for_it() {
    // Pid 50 was reused and began a session of its own: it is not the gone root, and it
    // started before the next invocation.
    let reused = process(50, 1, 50, 100);
    assert_eq!(earlier_pids(&[reused], &next_with_gone_root(), &[]), [50]);
}

/// A MainPID systemd named for a later invocation, which ignored its stop's SIGTERM
/// (SendSIGKILL=no), lives on as a gone root: it started as its invocation began, so it is
/// that root, not ours, even when an earlier count held it for want of knowing it.
#[test]
fn a_gone_root_that_outlived_its_stop_is_not_ours() {
    let root = process(50, 1, 50, 499);
    assert_eq!(
        earlier_pids(std::slice::from_ref(&root), &next_with_gone_root(), &[50]),
        Vec::<i32>::new()
    );
    // Where its invocation's beginning is unknown, its pid may have been used again.
    let unknown = NextInvocation {
        gone_roots: vec![GoneRoot {
            pid: 50,
            began_us: None,
        }],
        ..next_with_gone_root()
    };
    assert_eq!(earlier_pids(&[root], &unknown, &[50]), [50]);
}

#[test]
fn what_is_known_of_later_invocations_adds_up() {
    let mut next = NextInvocation {
        began_us: Some(9_000_000),
        roots_began_us: Some(9_000_000),
        roots: vec![90],
        gone_roots: vec![],
        once_held: OnceHeld::None,
        counted_roots: vec![],
    };
    let gone = |pid, began_us| GoneRoot { pid, began_us };
    next.absorb(&NextInvocation {
        began_us: Some(5_000_000),
        roots_began_us: Some(5_000_000),
        roots: vec![50],
        gone_roots: vec![gone(51, None), gone(90, Some(5_000_000))],
        once_held: OnceHeld::None,
        counted_roots: vec![],
    });
    assert_eq!(
        next,
        NextInvocation {
            began_us: Some(5_000_000),
            roots_began_us: Some(9_000_000),
            roots: vec![90],
            gone_roots: vec![gone(50, Some(5_000_000)), gone(51, None)],
            once_held: OnceHeld::None,
            counted_roots: vec![],
        },
        "the earliest beginning, the roots' own; every other root, once, with its own"
    );
    next.absorb(&NextInvocation::default());
    assert_eq!(next.began_us, Some(5_000_000));
}

/// systemd guesses the MainPID of a Type=forking service without PIDFile= whose ExecStart=
/// left no daemon (`unit_search_main_pid`): an earlier invocation's orphan, its parent the
/// manager, can be named the next invocation's MainPID (seen on systemd 252). One that
/// certainly started before the next invocation could fork is no root of it: it and what it
/// forks stay possibly ours.
#[test]
fn a_root_systemd_names_that_started_before_the_next_invocation_is_a_leftover() {
    let next = NextInvocation {
        began_us: Some(5_000_000),
        roots: vec![80],
        roots_began_us: Some(5_000_000),
        gone_roots: vec![],
        once_held: OnceHeld::None,
        counted_roots: vec![],
    };
    let guessed = process(80, 1, 70, 100);
    let its_child = process(81, 80, 70, 600);
    assert_eq!(earlier_pids(&[guessed, its_child], &next, &[]), [80, 81]);
    // A root forked just before the stamp of the beginning, within the slack, is the next's.
    let forked_first = process(80, 1, 80, 499);
    assert_eq!(earlier_pids(&[forked_first], &next, &[]), Vec::<i32>::new());
}

/// systemd guessed our leftover 50, leading session 50 since before the next invocation, as
/// its MainPID (`unit_search_main_pid`); 50 forked 61 after the next invocation began, then
/// died. 61 is ours, orphaned: the start a count held 50 with shows the guess.
#[test]
fn a_member_of_the_session_of_a_gone_guessed_root_is_ours() {
    let child = process(61, 1, 50, 600);
    let held_before = NextInvocation {
        once_held: OnceHeld::from(vec![ProcessStart {
            pid: 50,
            start_ticks: 100,
            held_as: None,
        }]),
        ..next_with_gone_root()
    };
    assert_eq!(
        earlier_pids(std::slice::from_ref(&child), &held_before, &[]),
        [61]
    );
    // Not known, the session is the one the gone root began for the next invocation; nor
    // where the process held with that pid started as the next invocation began.
    assert_eq!(
        earlier_pids(std::slice::from_ref(&child), &next_with_gone_root(), &[]),
        Vec::<i32>::new()
    );
    let its_own = NextInvocation {
        once_held: OnceHeld::from(vec![ProcessStart {
            pid: 50,
            start_ticks: 499,
            held_as: None,
        }]),
        ..next_with_gone_root()
    };
    assert_eq!(earlier_pids(&[child], &its_own, &[]), Vec::<i32>::new());
}

/// The same guess alive, gone as a root only (systemd named another MainPID): its own start
/// shows the session it leads is ours.
#[test]
fn a_member_of_the_session_of_a_living_guessed_gone_root_is_ours() {
    let census = [process(50, 1, 50, 100), process(61, 1, 50, 600)];
    assert_eq!(earlier_pids(&census, &next_with_gone_root(), &[]), [50, 61]);
}

/// A root systemd still names, held by an earlier count with a start before its invocation,
/// then dead before systemd said so: its session is not the next invocation's.
#[test]
fn a_member_of_the_session_of_a_dead_guessed_root_is_ours() {
    let next = NextInvocation {
        roots: vec![50],
        gone_roots: vec![],
        ..next_with_gone_root()
    };
    let child = process(61, 1, 50, 600);
    let held_before = NextInvocation {
        once_held: OnceHeld::from(vec![ProcessStart {
            pid: 50,
            start_ticks: 100,
            held_as: None,
        }]),
        ..next.clone()
    };
    assert_eq!(
        earlier_pids(std::slice::from_ref(&child), &held_before, &[]),
        [61]
    );
    assert_eq!(earlier_pids(&[child], &next, &[]), Vec::<i32>::new());
}

/// A pid held and exited, used again: the process alive now is judged by its own start.
#[test]
fn a_pid_held_before_and_used_again_by_the_next_invocation_is_its_root() {
    let next = NextInvocation {
        roots: vec![50],
        gone_roots: vec![],
        once_held: OnceHeld::from(vec![ProcessStart {
            pid: 50,
            start_ticks: 100,
            held_as: None,
        }]),
        ..next_with_gone_root()
    };
    let census = [process(50, 1, 50, 500), process(61, 50, 50, 600)];
    assert_eq!(earlier_pids(&census, &next, &[]), Vec::<i32>::new());
}

/// What is kept of exited processes: the last of a pid, the oldest dropped beyond the bound,
/// and what a later invocation's knowledge adds.
#[test]
fn the_starts_of_exited_processes_are_kept_once_each() {
    let start = |pid, start_ticks| ProcessStart {
        pid,
        start_ticks,
        held_as: None,
    };
    let mut next = NextInvocation::default();
    next.note_once_held(start(50, 100));
    next.note_once_held(start(51, 100));
    next.note_once_held(start(50, 300));
    assert_eq!(next.once_held.as_slice(), [start(51, 100), start(50, 300)]);
    next.absorb(&NextInvocation {
        once_held: OnceHeld::from(vec![start(52, 200)]),
        counted_roots: vec![],
        ..NextInvocation::default()
    });
    assert_eq!(next.once_held.as_slice().len(), 3);
    for pid in 100..200 {
        next.note_once_held(start(pid, 400));
    }
    assert_eq!(next.once_held.as_slice().len(), 64, "bounded");
    assert_eq!(next.once_held.as_slice().last(), Some(&start(199, 400)));
}

/// One process is kept inline, and the rule is the same there: a pid noted again replaces
/// the one before, keeping where a count first held it if it is the same process.
#[test]
fn one_start_kept_inline_follows_the_rule_of_many() {
    let held_as = Some(Lineage {
        parent: 0,
        session: 50,
    });
    let start = |start_ticks, held_as| ProcessStart {
        pid: 50,
        start_ticks,
        held_as,
    };
    let mut once_held = OnceHeld::None;
    once_held.note(start(100, held_as));
    once_held.note(start(100, None));
    assert!(matches!(once_held, OnceHeld::One(_)), "{once_held:?}");
    assert_eq!(once_held.as_slice(), [start(100, held_as)]);
    once_held.note(start(300, None));
    assert_eq!(once_held.as_slice(), [start(300, None)], "a pid used again");
    assert_eq!(
        OnceHeld::from(vec![start(300, None)]),
        OnceHeld::Many(Box::new(vec![start(300, None)])),
        "equal however held"
    );
}

/// As above, the guess's exit not yet heard when the count is made: it is still held, with the
/// start the count before saw, and that start tells (found by the simulator: the signal that
/// systemd's main process is gone came before the guess's pidfd was read).
#[test]
fn a_member_of_the_session_of_a_held_guessed_root_gone_unheard_is_ours() {
    let child = process(61, 1, 50, 600);
    let held = [
        ProcessStart {
            pid: 50,
            start_ticks: 100,
            held_as: None,
        },
        ProcessStart {
            pid: 61,
            start_ticks: 600,
            held_as: None,
        },
    ];
    assert_eq!(
        earlier_pids_holding(std::slice::from_ref(&child), &next_with_gone_root(), &held),
        [61]
    );
    // Held, the process named root started as its invocation began: its session is that
    // invocation's.
    let its_own = [ProcessStart {
        pid: 50,
        start_ticks: 499,
        held_as: None,
    }];
    assert_eq!(
        earlier_pids_holding(&[child], &next_with_gone_root(), &its_own),
        Vec::<i32>::new()
    );
}

/// systemd forked the next invocation's first process (its MainPID, Type=simple) 40 ms before
/// it stamped the beginning, preempted on a loaded machine (seen in CI, where this made two
/// real-systemd tests wait for the next invocation's main process): that root and what it
/// forked are the next invocation's. Where the invocation named another root first (the
/// ExecStart= of a Type=forking service, gone), a root that started before the stamp is a
/// guess; and one that started long before is a guess in any case.
#[test]
fn a_first_root_forked_before_a_late_stamp_is_the_next_invocations() {
    let next = NextInvocation {
        roots: vec![80],
        gone_roots: vec![],
        ..next_with_gone_root()
    };
    let census = [process(80, 1, 80, 496), process(81, 80, 80, 497)];
    assert_eq!(earlier_pids(&census, &next, &[]), Vec::<i32>::new());
    let after_exec_start = NextInvocation {
        gone_roots: vec![GoneRoot {
            pid: 79,
            began_us: Some(5_000_000),
        }],
        ..next.clone()
    };
    assert_eq!(earlier_pids(&census, &after_exec_start, &[]), [80, 81]);
    let long_before = [process(80, 1, 80, 400), process(81, 80, 80, 497)];
    assert_eq!(earlier_pids(&long_before, &next, &[]), [80, 81]);
}

/// An invocation that began at 6 s, for which systemd named 46 a root (its MainPID).
fn next_named_46_at_6s() -> NextInvocation {
    NextInvocation {
        began_us: Some(6_000_000),
        roots: vec![46],
        roots_began_us: Some(6_000_000),
        ..NextInvocation::default()
    }
}

/// Our ExecStop='s waiter (pid 45, started at 1 s in the session 44 its ExecStop= began, whose
/// pid the watch never heard) was held, then forked 46 as the next invocation began (6 s) and
/// exited; systemd guessed 46, alone under the manager, as that invocation's MainPID. 46 is in
/// a session a member of which started 5 s before that invocation: not one it began, so the
/// root is a guess, and ours. A daemon in a session with no member older than its invocation
/// is that invocation's, as systemd names it.
#[test]
fn a_root_in_a_session_older_than_its_invocation_is_a_guess() {
    let next = next_named_46_at_6s();
    let waiter = held_in(&process(45, 1, 44, 100), &[]);
    let census = [process(46, 1, 44, 600)];
    assert_eq!(earlier_pids_holding(&census, &next, &[waiter]), [46]);
    let mut told = next.clone();
    told.note_once_held(waiter);
    assert_eq!(
        earlier_pids_holding(&census, &told, &[]),
        [46],
        "as a count held it, exited since"
    );
    // Alive beside it, held or not: the session is as old.
    let both = [process(45, 1, 44, 100), process(46, 1, 44, 600)];
    assert_eq!(earlier_pids_holding(&both, &next, &[]), [45, 46]);
    // A daemon of the next invocation, in the session its ExecStart= (pid 43, named its
    // ControlPID) began at 6 s.
    let daemon = [process(47, 1, 43, 601)];
    let named = NextInvocation {
        roots: vec![47],
        gone_roots: vec![GoneRoot {
            pid: 43,
            began_us: Some(6_000_000),
        }],
        ..next
    };
    assert_eq!(
        earlier_pids_holding(&daemon, &named, &[]),
        Vec::<i32>::new()
    );
}

/// Our ExecStop='s waiter forked 46 as the next invocation began and exited, all while the
/// agent was down (so no count held it, and systemd named its ExecStop= 44 to an agent that is
/// gone); systemd guessed 46 as the new MainPID. Its session is not its own, and systemd never
/// named the session's leader a root of the invocation after ours: systemd begins a session for
/// each process it spawns, so a daemon it names rightly is in a session one of that
/// invocation's roots began. A guess, so ours (found by the simulator once such waiters were
/// modelled: 17028561802718, proven `replaced-after-stop` while 46's kin lived).
#[test]
fn a_root_in_a_session_no_root_of_its_invocation_began_is_a_guess() {
    let next = next_named_46_at_6s();
    let census = [process(46, 1, 44, 600)];
    assert_eq!(earlier_pids(&census, &next, &[]), [46]);
    // Its own session: what systemd spawns (a Type=simple MainPID, or a daemon that called
    // setsid) is the invocation's.
    let leader = [process(46, 1, 46, 600)];
    assert_eq!(earlier_pids(&leader, &next, &[]), Vec::<i32>::new());
    // In the session of the invocation's ExecStart=, which systemd named its ControlPID.
    let launched = NextInvocation {
        gone_roots: vec![GoneRoot {
            pid: 44,
            began_us: Some(6_000_000),
        }],
        ..next
    };
    assert_eq!(earlier_pids(&census, &launched, &[]), Vec::<i32>::new());
}

#[test]
fn a_cgroup_path_is_within_a_subtree_only_below_its_top() {
    let unit = "/app.slice/x.service";
    assert_eq!(within_cgroup(unit, unit), Some(PathBuf::new()));
    assert_eq!(
        within_cgroup("/app.slice/x.service/a/b", unit),
        Some(PathBuf::from("a/b"))
    );
    assert_eq!(within_cgroup("/app.slice/x.service-2", unit), None);
    assert_eq!(within_cgroup("/app.slice", unit), None);
    assert_eq!(within_cgroup("/a", "/"), Some(PathBuf::from("a")));
}

/// A process is found by its own `/proc/PID/cgroup`, wherever in the subtree it is: the walk
/// of `cgroup.procs` files can miss one moved from a cgroup not yet walked into one already
/// walked. One the census holds already is not listed twice.
#[test]
fn a_scan_finds_each_member_of_a_subtree_by_its_own_membership() {
    let Some(mut scratch) = ScratchCgroup::new() else {
        return;
    };
    scratch.mkdir("a");
    scratch.mkdir("a/b");
    let top = scratch.spawn_sleep_in("");
    let deep = scratch.spawn_sleep_in("a/b");
    let cgroup = format!("/{}", scratch.name);
    let own = fs::read_to_string("/proc/self/cgroup").expect("read /proc/self/cgroup");
    if !own.lines().any(|line| line == "0::/") {
        println!("skipped: this test's cgroup namespace is not the mount's root: {own}");
        return;
    }
    let mut census = Census {
        processes: vec![process(top, 1, top, start_ticks(top))],
        vanished: 0,
    };
    scan_members(Path::new("/proc"), &cgroup, WALK_LIMITS, &mut census).expect("scan");
    assert_eq!(
        pids_of(&census.processes),
        [(top, String::new()), (deep, "a/b".to_owned())]
    );
    assert_eq!(census.processes[1].start_ticks, start_ticks(deep));
}

/// Our root 106 (never named for ours to this watch, gone before any count saw it) was named
/// the next invocation's MainPID, which began at 2.1 s; a count had held 110, a member of its
/// session that started at 1.56 s. 127, forked into that session at 34.8 s, is ours: the
/// session is older than the invocation, so 106 was systemd's guess, gone or not.
#[test]
fn a_gone_root_whose_session_is_older_than_its_invocation_is_a_guess() {
    let next = NextInvocation {
        began_us: Some(2_109_538),
        roots_began_us: Some(2_109_538),
        gone_roots: vec![GoneRoot {
            pid: 106,
            began_us: Some(2_109_538),
        }],
        ..NextInvocation::default()
    };
    let member = held_in(&process(110, 1, 106, 156), &[]);
    let census = [process(127, 1, 106, 3480)];
    assert_eq!(earlier_pids_holding(&census, &next, &[member]), [127]);
    let mut told = next.clone();
    told.note_once_held(member);
    assert_eq!(earlier_pids_holding(&census, &told, &[]), [127]);
    // No member known older than the invocation: the gone root's session is its.
    assert_eq!(earlier_pids_holding(&census, &next, &[]), Vec::<i32>::new());
}
