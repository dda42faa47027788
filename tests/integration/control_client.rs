//! Tests of the blocking CLI client against a real control server running its mio loop in a thread.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

use exitproof::control::ClientId;
use exitproof::control::ControlError;
use exitproof::control::client::Client;
use exitproof::control::protocol::{
    Command, ErrorKind, Request, RequestId, Response, StreamedReply, Version, WaitArgs, WatchArgs,
    WatchSpec, event_line, list_reply,
};
use exitproof::control::server::{ClientInput, ControlServer, ServerOptions};
use exitproof::control::wire::{
    AgentStats, Bucket, Cause, CoreStats, EventAnswer, EventKind, InotifyStats, JournaldStats,
    LatencySummary, Level, ListAnswer, LoopStats, Phase, PhaseCounts, ProofCounts, ProofEvent,
    RemainingProcess, SanitizedRecord, SlowTurn, StatsAnswer, StatusAnswer, TurnWork, UnitStatus,
    VersionAnswer, WatchAnswer, WatchView,
};
use exitproof::unit_name::UnitName;
use mio::{Events, Poll, Token, Waker};
use serde_json::json;

const PATIENCE: Duration = Duration::from_secs(20);
const WAKE: Token = Token(0);

/// Units in the toy agent's streamed `list` reply.
const UNITS: usize = 100_000;

/// One unit of the streamed `list`, about 400 bytes serialized.
fn unit(n: usize) -> serde_json::Value {
    json!({"unit": format!("unit-{n:06}.service"), "n": n, "pad": "p".repeat(350)})
}

/// What a toy agent sends for a request.
enum Reply {
    Lines(Vec<String>),
    Streamed(StreamedReply),
}

/// A toy agent answering each request with what `answer` makes of it. Stops (and joins) on
/// drop, so a failing test leaves no thread behind.
struct Agent {
    waker: Waker,
    thread: Option<JoinHandle<()>>,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

/// Answers `list` with its client's id (or, when the request's id is `"big"`, with a streamed
/// list of [`UNITS`] units), `events` with ok plus two events.
fn raw_answer(client: ClientId, request: Request) -> Reply {
    match request.command {
        Command::List if request.id == Some(RequestId::Text("big".to_owned())) => {
            Reply::Streamed(list_reply(request.id, (0..UNITS).map(unit)))
        }
        Command::Events => {
            let mut lines = vec![Response::ok(request.id, ()).to_line()];
            for n in 0..2 {
                lines.push(event_line(&json!({"n": n})).expect("event"));
            }
            Reply::Lines(lines)
        }
        command => {
            let payload = json!({"client": client.to_string(), "cmd": command.name()});
            Reply::Lines(vec![Response::ok(request.id, payload).to_line()])
        }
    }
}

impl Agent {
    fn start() -> Agent {
        Agent::answering(raw_answer)
    }

    fn answering(answer: fn(ClientId, Request) -> Reply) -> Agent {
        let dir = tempfile::tempdir().expect("create temporary directory");
        let path = dir.path().join("agent.sock");
        let mut server = ControlServer::bind(&path, ServerOptions::default()).expect("bind");
        let mut poll = Poll::new().expect("create poll");
        let waker = Waker::new(poll.registry(), WAKE).expect("create waker");
        server
            .register(poll.registry(), 1..1024)
            .expect("register server");
        let thread = std::thread::spawn(move || {
            let mut events = Events::with_capacity(16);
            let mut out = Vec::new();
            loop {
                if let Err(e) = poll.poll(&mut events, None) {
                    assert_eq!(e.kind(), std::io::ErrorKind::Interrupted, "poll: {e}");
                    continue;
                }
                for event in events.iter() {
                    if event.token() == WAKE {
                        return;
                    }
                    server.handle_event(poll.registry(), event, &mut out);
                }
                for event in out.drain(..) {
                    let ClientInput::Request { client, request } = event else {
                        continue;
                    };
                    let registry = poll.registry();
                    match answer(client, request) {
                        Reply::Lines(lines) => {
                            for line in lines {
                                server.send(registry, client, &line);
                            }
                        }
                        Reply::Streamed(reply) => {
                            server.send_streamed(registry, client, reply);
                        }
                    }
                }
            }
        });
        Agent {
            waker,
            thread: Some(thread),
            path,
            _dir: dir,
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.waker.wake().is_ok()
            && let Some(thread) = self.thread.take()
        {
            let _ = thread.join();
        }
    }
}

fn connect(path: &Path) -> Client {
    let mut client = Client::connect(path).expect("connect to agent");
    client
        .set_read_timeout(Some(PATIENCE))
        .expect("set read timeout");
    client
}

#[test]
fn request_gets_its_response() {
    let agent = Agent::start();
    let mut client = connect(&agent.path);
    let response = client
        .request_json(&json!({"id": 5, "cmd": "list"}))
        .expect("list");
    assert_eq!(response["id"], json!(5));
    assert_eq!(response["ok"], json!(true));
    assert_eq!(response["cmd"], json!("list"));
    let response = client
        .request_json(&json!({"id": "bad", "cmd": "frob"}))
        .expect("server-side error");
    assert_eq!(response["error"]["kind"], json!("unknown-command"));
    assert_eq!(response["id"], json!("bad"));
}

#[test]
fn event_stream_is_read_line_by_line() {
    let agent = Agent::start();
    let mut client = connect(&agent.path);
    let response = client
        .request_json(&json!({"cmd": "events"}))
        .expect("subscribe");
    assert_eq!(response, json!({"ok": true}));
    for n in 0..2 {
        assert_eq!(
            client.next_json().expect("event"),
            Some(json!({"event": {"n": n}}))
        );
    }
    client
        .set_read_timeout(Some(Duration::from_millis(50)))
        .expect("set short timeout");
    let err = client.next_json().expect_err("no more events");
    assert!(matches!(err, ControlError::TimedOut { .. }), "{err:?}");
}

#[test]
fn agent_going_away_ends_the_stream() {
    let agent = Agent::start();
    let mut client = connect(&agent.path);
    client
        .request_json(&json!({"cmd": "events"}))
        .expect("subscribe");
    client.next_json().expect("event 0");
    client.next_json().expect("event 1");
    let path = agent.path.clone();
    drop(agent);
    assert_eq!(client.next_json().expect("clean end"), None);
    let err = client
        .request_json(&json!({"cmd": "list"}))
        .expect_err("gone");
    assert!(
        matches!(
            err,
            ControlError::Disconnected { .. } | ControlError::Io { .. }
        ),
        "{err:?}"
    );
    let err = Client::connect(&path).expect_err("socket removed");
    assert!(matches!(err, ControlError::NoAgent { .. }), "{err:?}");
}

#[test]
fn missing_socket_says_no_agent() {
    let dir = tempfile::tempdir().expect("create temporary directory");
    let path = dir.path().join("nothing.sock");
    let err = Client::connect(&path).expect_err("no socket");
    assert_eq!(
        err.to_string(),
        format!(
            "no agent listening on {} (is `exitproof agent` running?)",
            path.display()
        )
    );
    // A stale socket file (nobody listening) is reported the same way.
    drop(std::os::unix::net::UnixListener::bind(&path).expect("bind stale"));
    let err = Client::connect(&path).expect_err("stale socket");
    assert!(matches!(err, ControlError::NoAgent { .. }), "{err:?}");
}

#[test]
fn a_list_of_100000_units_is_read_as_one_line() {
    let agent = Agent::start();
    let mut client = connect(&agent.path);
    let started = std::time::Instant::now();
    let response = client
        .request_json(&json!({"id": "big", "cmd": "list"}))
        .expect("list");
    let elapsed = started.elapsed();
    let units = response["units"].as_array().expect("units array");
    eprintln!("read a list of {} units in {elapsed:?}", units.len());
    assert_eq!(response["id"], json!("big"));
    assert_eq!(units.len(), UNITS);
    for (n, listed) in units.iter().enumerate() {
        assert_eq!(listed, &unit(n), "unit {n}");
    }
    // The connection goes on: the next response is whole.
    let response = client
        .request_json(&json!({"id": 2, "cmd": "list"}))
        .expect("small list");
    assert_eq!(response["id"], json!(2));
}

#[test]
fn a_line_over_the_limit_fails_without_being_buffered() {
    let agent = Agent::start();
    let mut client = connect(&agent.path);
    client.set_max_line(1024 * 1024);
    let err = client
        .request_json(&json!({"id": "big", "cmd": "list"}))
        .expect_err("too long");
    assert!(
        matches!(err, ControlError::LineTooLong { limit, .. } if limit == 1024 * 1024),
        "{err:?}"
    );
    // The rest of that line is never read, so the connection stays unusable.
    let err = client.next_json().expect_err("still out of step");
    assert!(matches!(err, ControlError::LineTooLong { .. }), "{err:?}");
}

const INVOCATION: &str = "648c3d6bd5e04b029f110c67119f64cb";

fn proof_event(unit: &str) -> ProofEvent {
    ProofEvent {
        kind: EventKind::Proven,
        unit: unit.to_owned(),
        invocation: INVOCATION.to_owned(),
        level: Level::Info,
        message: "instance exited (exit 0)".to_owned(),
        cause: Cause::Exited,
        proven_mono_ns: 53_121_678_244_136,
        proven_realtime_us: Some(1_764_921_600_000_000),
        stop_requested: true,
        systemd: Some(SanitizedRecord {
            result: "success".to_owned(),
            code: "killed".to_owned(),
            status: "TERM".to_owned(),
        }),
        record: None,
        generation: Some(7),
        launch_file: Some("/run/web-7.env".to_owned()),
    }
}

fn watch_view(unit: &str) -> WatchView {
    WatchView {
        unit: unit.to_owned(),
        invocation: Some(INVOCATION.to_owned()),
        active_state: Some("active".to_owned()),
        sub_state: Some("running".to_owned()),
        populated: Some(true),
        phase: Phase::Watching,
        stop_requested: false,
        run_dir: None,
        record: None,
        generation: Some(7),
        launch_file: Some("/run/web-7.env".to_owned()),
        proof: None,
        now_running: None,
    }
}

/// A toy agent speaking the typed answers, built by the agent's own serializers: `watch` and
/// `list` with views, `wait` still running, `stop` with its event, `unwatch` not watched unless
/// the unit is `web.service`, `version`, and `events` with a line of a type this client does not
/// know between two proofs, the second from a newer agent (an unknown cause, an unknown field).
fn typed_answer(_: ClientId, request: Request) -> Reply {
    let id = request.id;
    let line = match request.command {
        Command::Watch(args) => Response::ok(
            id,
            WatchAnswer {
                watch: watch_view(args.unit.as_str()),
            },
        )
        .to_line(),
        Command::Start(args) => Response::error(
            id,
            ErrorKind::NotFound,
            format!("start {}: Unit {} not found.", args.unit, args.unit),
        )
        .to_line(),
        Command::Wait(args) => Response::error(
            id,
            ErrorKind::StillRunning,
            format!("{} still running: not proven before the timeout", args.unit),
        )
        .to_line(),
        Command::Stop(args) => Response::ok(
            id,
            EventAnswer {
                event: proof_event(args.unit.as_str()),
                now_running: None,
                moved_on_from: None,
            },
        )
        .to_line(),
        Command::Unwatch(args)
            if args.unit.as_ref().map(UnitName::as_str) == Some("web.service") =>
        {
            Response::ok(id, ()).to_line()
        }
        Command::Unwatch(args) => Response::error(
            id,
            ErrorKind::NotWatched,
            format!("{} is not watched", args.unit.expect("a unit")),
        )
        .to_line(),
        Command::List => {
            let units = vec![watch_view("a.service"), watch_view("b.service")];
            return Reply::Streamed(list_reply(id, units));
        }
        Command::Version => Response::ok(
            id,
            VersionAnswer {
                version: Version::CURRENT,
            },
        )
        .to_line(),
        Command::Status(args) => Response::ok(
            id,
            StatusAnswer {
                status: sample_status(args.unit.as_str()),
            },
        )
        .to_line(),
        Command::Stats => Response::ok(
            id,
            StatsAnswer {
                stats: sample_stats(),
            },
        )
        .to_line(),
        Command::Events => {
            let mut newer = serde_json::to_value(proof_event("b.service")).expect("event");
            newer["cause"] = json!("a-cause-from-the-future");
            newer["new_field"] = json!({"ignored": true});
            return Reply::Lines(vec![
                Response::ok(id, ()).to_line(),
                event_line(&proof_event("a.service")).expect("event"),
                event_line(&json!({"type": "heartbeat", "unit": "a.service"})).expect("event"),
                event_line(&newer).expect("event"),
            ]);
        }
    };
    Reply::Lines(vec![line])
}

/// A blocked unit's status, one process listed of two.
fn sample_status(unit: &str) -> UnitStatus {
    UnitStatus {
        watch: watch_view(unit),
        cgroup: Some(format!("/app.slice/{unit}")),
        blocked: true,
        terminal_since_mono_ns: Some(5_000_000_000),
        terminal_for_ms: Some(1500),
        leftovers: vec![41],
        remaining: Some(vec![RemainingProcess {
            pid: 42,
            comm: "flush".to_owned(),
            state: "D".to_owned(),
            cgroup: format!("/app.slice/{unit}/worker"),
        }]),
        remaining_total: Some(2),
        remaining_error: None,
        cgroup_error: Some("not found where systemd says (/x.service)".to_owned()),
        systemd_error: Some("the bus connection closed".to_owned()),
    }
}

#[test]
fn status_comes_back_as_the_agent_sent_it() {
    let agent = Agent::answering(typed_answer);
    let mut client = connect(&agent.path);
    let web = unit_name("web.service");
    assert_eq!(
        client.status(&web).expect("status"),
        sample_status("web.service")
    );
}

/// Figures with every field set apart from the others, so a field read into another shows.
fn sample_stats() -> AgentStats {
    AgentStats {
        core: CoreStats {
            watches: PhaseCounts {
                watching: 1,
                stopping: 2,
                proven: 3,
            },
            blocked: 4,
            proofs: ProofCounts {
                exited: 5,
                replaced_after_stop: 6,
                restarted_outside: 7,
                rebooted: 8,
            },
            resyncs: 9,
            proof_latency: LatencySummary {
                buckets: vec![
                    Bucket {
                        le_us: Some(100),
                        count: 10,
                    },
                    Bucket {
                        le_us: None,
                        count: 11,
                    },
                ],
                sum_us: 12,
                count: 11,
            },
        },
        bus_reconnects: 13,
        systemd_error: Some(":1.9 (pid 17, uid 18) owns org.freedesktop.systemd1".to_owned()),
        inotify: InotifyStats {
            watches: 14,
            overflows: 15,
        },
        journald: JournaldStats { dropped: 16 },
        event_loop: LoopStats {
            proof_latency: LatencySummary {
                buckets: vec![Bucket {
                    le_us: None,
                    count: 17,
                }],
                sum_us: 18,
                count: 17,
            },
            proof_latency_max_us: 19,
            turns: 20,
            work: TurnWork {
                inputs: 21,
                proofs: 22,
                saves: 23,
                save_us: 24,
                syncs: 25,
                sync_us: 26,
                cgroup_reads: 27,
                cgroup_read_us: 28,
                trims: 29,
                trim_us: 30,
                census_us: 36,
                bus_us: 37,
                rules_us: 38,
                tell_us: 39,
                log_us: 40,
                cpu_us: 33,
                minor_faults: 34,
                preemptions: 35,
            },
            slowest_proofs: vec![SlowTurn {
                at_mono_ns: 31,
                us: 32,
                work: TurnWork::default(),
            }],
            slowest_turns: Vec::new(),
        },
    }
}

#[test]
fn stats_come_back_as_the_agent_sent_them() {
    let agent = Agent::answering(typed_answer);
    let mut client = connect(&agent.path);
    assert_eq!(client.stats().expect("stats"), sample_stats());
}

fn unit_name(name: &str) -> UnitName {
    name.parse().expect("a valid unit name")
}

#[test]
fn typed_requests_get_typed_answers() {
    let agent = Agent::answering(typed_answer);
    let mut client = connect(&agent.path);
    let web = unit_name("web.service");
    let view = client.watch(WatchArgs::new(web.clone())).expect("watch");
    assert_eq!(view, watch_view("web.service"));
    let event = client
        .stop(&web, Some(Duration::from_secs(30)))
        .expect("stop");
    assert_eq!(event.event, proof_event("web.service"));
    let err = client.start(&web).expect_err("not found");
    assert_eq!(err.kind(), Some(ErrorKind::NotFound), "{err:?}");
    let units = client.list().expect("list");
    assert_eq!(
        units,
        vec![watch_view("a.service"), watch_view("b.service")]
    );
    assert_eq!(client.version().expect("version"), Version::CURRENT);
    client.unwatch(&web).expect("unwatch");
}

#[test]
fn a_refusal_carries_the_error_kind_and_the_agents_message() {
    let agent = Agent::answering(typed_answer);
    let mut client = connect(&agent.path);
    let err = client
        .wait(&unit_name("web.service"), Some(Duration::ZERO))
        .expect_err("still running");
    assert_eq!(err.kind(), Some(ErrorKind::StillRunning), "{err:?}");
    assert_eq!(
        err.to_string(),
        "web.service still running: not proven before the timeout"
    );
    let err = client
        .unwatch(&unit_name("other.service"))
        .expect_err("not watched");
    assert_eq!(err.kind(), Some(ErrorKind::NotWatched), "{err:?}");
    // The connection goes on after a refusal.
    client.list().expect("list after refusals");
}

#[test]
fn an_unknown_error_kind_is_a_refusal_of_kind_unknown() {
    let agent = Agent::answering(|_, request| {
        let line = format!(
            "{{\"id\":{},\"ok\":false,\"error\":{{\"kind\":\"over-quota\",\"message\":\"too many\"}}}}",
            serde_json::to_string(&request.id).expect("id")
        );
        Reply::Lines(vec![line])
    });
    let err = connect(&agent.path).list().expect_err("refused");
    assert_eq!(err.kind(), Some(ErrorKind::Unknown), "{err:?}");
    assert_eq!(err.to_string(), "too many");
}

#[test]
fn the_event_stream_skips_unknown_types_and_reads_newer_events() {
    let agent = Agent::answering(typed_answer);
    let mut events = connect(&agent.path).events().expect("subscribe");
    assert_eq!(
        events.next().expect("first").expect("an event"),
        proof_event("a.service")
    );
    let newer = events.next().expect("second").expect("an event");
    assert_eq!(
        newer,
        ProofEvent {
            cause: Cause::Other,
            ..proof_event("b.service")
        }
    );
    drop(agent);
    assert!(events.next().is_none(), "the stream ends with the agent");
}

#[test]
fn a_typed_request_is_the_line_the_agent_parses() {
    let unit = unit_name("web.service");
    let requests = [
        Command::Watch(WatchArgs {
            invocation: Some(INVOCATION.to_owned()),
            spec: WatchSpec {
                run_dir: Some("/run/web".into()),
                record: Some(
                    exitproof::record_name::RecordName::parse("exit.json").expect("a valid name"),
                ),
                generation: Some(7),
                launch_file: Some("/run/web-7.env".into()),
            },
            ..WatchArgs::new(unit.clone())
        }),
        Command::Watch(WatchArgs::new(unit.clone())),
        Command::Wait(WaitArgs {
            unit: unit.clone(),
            timeout: Some(Duration::from_millis(1500)),
        }),
        Command::Stop(WaitArgs {
            unit: unit.clone(),
            timeout: None,
        }),
        Command::List,
        Command::Events,
        Command::Version,
    ];
    for (n, command) in requests.into_iter().enumerate() {
        let request = Request {
            id: Some(RequestId::Number(n.into())),
            command,
        };
        let line = serde_json::to_string(&request).expect("serialize");
        let parsed = exitproof::control::protocol::parse_request(line.as_bytes())
            .unwrap_or_else(|e| panic!("{line}: {e}"));
        assert_eq!(parsed, request, "{line}");
    }
    let line = serde_json::to_string(&Request {
        id: None,
        command: Command::Wait(WaitArgs {
            unit,
            timeout: Some(Duration::from_millis(1500)),
        }),
    })
    .expect("serialize");
    assert_eq!(
        line,
        r#"{"cmd":"wait","unit":"web.service","timeout_ms":1500}"#
    );
}

#[test]
fn every_answer_the_agent_builds_reads_back_into_its_wire_type() {
    fn round_trip<T>(value: &T)
    where
        T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
    {
        let line = Response::ok(Some(RequestId::Number(1.into())), value).to_line();
        let back: T = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
        assert_eq!(&back, value, "{line}");
        // Nothing of the line is lost in the typed value.
        let mut raw: serde_json::Value = serde_json::from_str(&line).expect("JSON");
        let raw = raw.as_object_mut().expect("an object");
        raw.remove("id");
        raw.remove("ok");
        assert_eq!(
            serde_json::Value::Object(raw.clone()),
            serde_json::to_value(value).expect("to value"),
            "{line}"
        );
    }
    let mut proven = watch_view("web.service");
    proven.phase = Phase::Proven;
    proven.proof = Some(proof_event("web.service"));
    round_trip(&WatchAnswer {
        watch: proven.clone(),
    });
    round_trip(&EventAnswer {
        event: proof_event("web.service"),
        now_running: Some("b".repeat(32)),
        moved_on_from: Some("c".repeat(32)),
    });
    round_trip(&ListAnswer {
        units: vec![proven, watch_view("a.service")],
    });
    round_trip(&VersionAnswer {
        version: Version::CURRENT,
    });
    // The streamed list is the same line.
    let units = vec![watch_view("a.service")];
    let mut reply = list_reply(None, units.clone());
    let mut line = Vec::new();
    while reply.write_next(&mut line).expect("write") {}
    let back: ListAnswer = serde_json::from_slice(&line).expect("a list answer");
    assert_eq!(back.units, units);
    // An event line is an event answer.
    let line = event_line(&proof_event("a.service")).expect("event line");
    let back: EventAnswer = serde_json::from_str(&line).expect("an event answer");
    assert_eq!(back.event, proof_event("a.service"));
}
