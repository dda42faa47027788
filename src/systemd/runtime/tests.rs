//! Unit tests of the mio runtime on its own, with no bus: tokens, the agent-style loop, timers,
//! wakes from another thread, connects, what dropping the runtime releases, and floods over a
//! peer-to-peer zbus connection that must lose no wake.
//!
//! They must never leave a thread, socket or file behind: the one thread is joined, sockets
//! close with their owners, and files live in a temporary directory removed on drop.

use std::{
    future::{Future, poll_fn},
    io::{self, Read, Write},
    net::{TcpListener, TcpStream},
    os::{fd::OwnedFd, unix::net::UnixListener, unix::net::UnixStream},
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll, Waker},
    time::{Duration, Instant},
};

use mio::{Events, Token};
use zbus::runtime::{
    Interest, IoSource,
    traits::{PollIo, Runtime as _, TaskHandle as _},
};

use super::{MioRuntime, RuntimeError, Task};

/// The waker token every test gives the runtime.
const WAKER: Token = Token(0);
/// The source tokens every test gives the runtime, unless it tests the range itself.
const SOURCES: std::ops::Range<usize> = 100..200;
/// How long a test waits for something the kernel is to report, before it gives up.
const PATIENCE: Duration = Duration::from_secs(20);

/// A poll and a runtime on it.
fn runtime_with(sources: std::ops::Range<usize>) -> (mio::Poll, MioRuntime) {
    let poll = mio::Poll::new().expect("a poll");
    let runtime = MioRuntime::new(poll.registry(), WAKER, sources).expect("a runtime");

    (poll, runtime)
}

/// One pass of the agent's loop: wait, hand the runtime its events, turn. Returns the tokens
/// the poll reported.
fn agent_pass(poll: &mut mio::Poll, runtime: &MioRuntime, limit: Duration) -> Vec<Token> {
    let mut events = Events::with_capacity(16);
    let timeout = runtime.timeout().map_or(limit, |t| t.min(limit));
    poll.poll(&mut events, Some(timeout))
        .expect("the poll waits");
    let tokens = events.iter().map(|event| event.token()).collect();
    for event in events.iter() {
        assert!(runtime.owns(event.token()), "only the runtime registered");
        runtime.handle_event(event);
    }
    runtime.turn();

    tokens
}

/// Drives the agent's loop until `done` says so, or panics after [`PATIENCE`].
fn drive_until(poll: &mut mio::Poll, runtime: &MioRuntime, mut done: impl FnMut() -> bool) {
    let give_up = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < give_up, "the runtime did not get there");
        agent_pass(poll, runtime, PATIENCE);
    }
}

/// Reads from `source` once it is readable, through the runtime's readiness wait.
async fn read_some(registration: &impl PollIo, stream: &UnixStream) -> io::Result<Vec<u8>> {
    let mut buffer = [0u8; 64];
    let read =
        poll_fn(|cx| registration.poll_io(cx, Interest::Readable, || (&*stream).read(&mut buffer)))
            .await?;

    Ok(buffer[..read].to_vec())
}

/// A unix stream pair, the first end non-blocking and shared as an `IoSource`.
fn stream_pair() -> (IoSource, UnixStream, UnixStream) {
    let (ours, theirs) = UnixStream::pair().expect("a socket pair");
    ours.set_nonblocking(true).expect("non-blocking");
    let source = IoSource::from(OwnedFd::from(ours.try_clone().expect("a clone")));

    (source, ours, theirs)
}

/// Polls `task` once, with a waker that does nothing.
fn poll_once<T>(task: &mut Task<T>) -> Poll<io::Result<T>> {
    Pin::new(task).poll(&mut Context::from_waker(Waker::noop()))
}

#[test]
fn new_refuses_a_waker_token_inside_the_source_range() {
    let cases = [
        (Token(0), 1..10, true),
        (Token(10), 1..10, true),
        (Token(1), 1..10, false),
        (Token(9), 1..10, false),
    ];
    for (waker, sources, accepted) in cases {
        let poll = mio::Poll::new().expect("a poll");
        match MioRuntime::new(poll.registry(), waker, sources.clone()) {
            Ok(_) => assert!(accepted, "{waker:?} in {sources:?} was accepted"),
            Err(e) => {
                assert!(!accepted, "{waker:?} in {sources:?} was refused: {e}");
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
                assert_eq!(
                    e.to_string(),
                    format!(
                        "waker token {} lies in the source token range 1..10",
                        waker.0
                    )
                );
            }
        }
    }
}

#[test]
fn owns_the_waker_token_and_the_source_range_only() {
    let (_poll, runtime) = runtime_with(SOURCES);
    let cases = [
        (WAKER, true),
        (Token(SOURCES.start), true),
        (Token(SOURCES.end - 1), true),
        (Token(SOURCES.end), false),
        (Token(1), false),
    ];
    for (token, owned) in cases {
        assert_eq!(runtime.owns(token), owned, "{token:?}");
    }
}

#[test]
fn an_exhausted_token_range_is_an_error_and_freed_tokens_are_reused() {
    let (_poll, runtime) = runtime_with(10..12);
    let handle = runtime.handle();
    let pairs: Vec<_> = (0..3).map(|_| stream_pair()).collect();

    let first = handle
        .register_io_source(pairs[0].0.clone())
        .expect("token 10");
    let second = handle
        .register_io_source(pairs[1].0.clone())
        .expect("token 11");
    let refused = handle
        .register_io_source(pairs[2].0.clone())
        .err()
        .expect("no token left");
    assert_eq!(refused.kind(), io::ErrorKind::QuotaExceeded);
    assert_eq!(
        refused
            .get_ref()
            .and_then(|e| e.downcast_ref::<RuntimeError>()),
        Some(&RuntimeError::SourceTokensExhausted { sources: 10..12 })
    );
    assert_eq!(refused.to_string(), "all source tokens 10..12 are in use");

    // With `second` still holding the range's other token, only reuse can make room.
    drop(first);
    let third = handle
        .register_io_source(pairs[2].0.clone())
        .expect("the freed token");
    drop((second, third));
}

#[test]
fn timeout_is_zero_while_runnables_wait_and_otherwise_until_the_earliest_timer() {
    let (_poll, runtime) = runtime_with(SOURCES);
    assert_eq!(runtime.timeout(), None, "no timers, no runnables");

    let handle = runtime.handle();
    let task = runtime.spawn(async move { handle.sleep(Duration::from_secs(3600)).await });
    assert_eq!(runtime.timeout(), Some(Duration::ZERO), "a runnable waits");

    runtime.turn();
    let timeout = runtime.timeout().expect("a timer waits");
    assert!(timeout > Duration::from_secs(3000), "{timeout:?}");
    assert!(timeout <= Duration::from_secs(3600), "{timeout:?}");

    drop(task);
    runtime.turn();
    assert_eq!(runtime.timeout(), None, "a cancelled sleep leaves no timer");
}

#[test]
fn a_task_woken_by_handle_event_runs_in_the_next_turn() {
    let (mut poll, runtime) = runtime_with(SOURCES);
    let (source, ours, mut theirs) = stream_pair();
    let registration = runtime
        .handle()
        .register_io_source(source)
        .expect("registered");
    let mut task = runtime.spawn(async move { read_some(&registration, &ours).await });

    runtime.turn();
    assert!(poll_once(&mut task).is_pending(), "nothing was written yet");

    theirs.write_all(b"ping").expect("a write");
    drive_until(&mut poll, &runtime, || task.is_finished());
    match poll_once(&mut task) {
        Poll::Ready(Ok(Ok(read))) => assert_eq!(read, b"ping"),
        other => panic!("the read did not complete: {other:?}"),
    }
}

#[test]
fn a_runnable_scheduled_during_a_turn_runs_in_that_turn() {
    let (_poll, runtime) = runtime_with(SOURCES);
    let handle = runtime.handle();
    let mut outer = runtime.spawn(async move {
        let inner = handle.spawn("inner", async { 7 });
        inner.await.map(|value| value * 6)
    });

    runtime.turn();
    match poll_once(&mut outer) {
        Poll::Ready(Ok(Ok(value))) => assert_eq!(value, 42),
        other => panic!("the tasks did not finish in one turn: {other:?}"),
    }
    assert_eq!(runtime.timeout(), None, "nothing is left to run");
}

#[test]
fn a_timer_wakes_its_task_through_the_agent_loop() {
    let (mut poll, runtime) = runtime_with(SOURCES);
    let handle = runtime.handle();
    let started = Instant::now();
    let task = runtime.spawn(async move { handle.sleep(Duration::from_millis(30)).await });

    drive_until(&mut poll, &runtime, || task.is_finished());
    assert!(
        started.elapsed() >= Duration::from_millis(30),
        "fired early"
    );
    assert_eq!(runtime.timeout(), None, "the fired timer left the map");
}

#[test]
fn a_spawn_from_another_thread_interrupts_the_poll() {
    let (mut poll, runtime) = runtime_with(SOURCES);
    let handle = runtime.handle();
    let ran = Arc::new(Mutex::new(false));

    let spawner = std::thread::spawn({
        let ran = ran.clone();
        move || handle.spawn("remote", async move { *super::lock(&ran) = true })
    });
    // The loop waits with no timeout of its own: only the waker can end this wait early.
    let mut tokens = Vec::new();
    let give_up = Instant::now() + PATIENCE;
    while !tokens.contains(&WAKER) && Instant::now() < give_up {
        tokens = agent_pass(&mut poll, &runtime, PATIENCE);
    }
    assert!(
        tokens.contains(&WAKER),
        "the waker never interrupted the poll"
    );

    let task = spawner.join().expect("the spawning thread");
    drive_until(&mut poll, &runtime, || task.is_finished());
    assert!(*super::lock(&ran));
}

#[test]
fn a_spawn_on_the_loops_own_thread_queues_without_writing_the_waker() {
    let (mut poll, runtime) = runtime_with(SOURCES);
    // Asking how long to wait makes this thread the one that waits.
    assert_eq!(runtime.timeout(), None);
    let task = runtime.spawn(async { 7 });
    // The next ask sees the runnable, so the loop does not wait for a wake...
    assert_eq!(runtime.timeout(), Some(Duration::ZERO));
    // ...and none was written: a poll that does not wait reports no event at all.
    let mut events = Events::with_capacity(4);
    poll.poll(&mut events, Some(Duration::ZERO))
        .expect("the poll answers");
    assert!(events.is_empty(), "the waker was written");
    runtime.turn();
    assert!(task.is_finished());
}

#[test]
fn block_on_connects_over_unix_and_tcp() {
    let directory = tempfile::tempdir().expect("a temporary directory");
    let unix_path = directory.path().join("listener");
    let unix_listener = UnixListener::bind(&unix_path).expect("a unix listener");
    let tcp_listener = TcpListener::bind("127.0.0.1:0").expect("a tcp listener");
    let tcp_address = tcp_listener.local_addr().expect("its address");
    // A port that was just free and is closed again, so a connect to it is refused.
    let closed_address = TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port");
    let missing_path = directory.path().join("missing");

    let (mut poll, runtime) = runtime_with(SOURCES);
    let handle = runtime.handle();
    let outcomes = runtime
        .block_on(&mut poll, async {
            [
                handle.connect_unix(&unix_path).await.map(drop),
                handle.connect_unix(&missing_path).await.map(drop),
                handle.connect_tcp(tcp_address).await.map(drop),
                handle.connect_tcp(closed_address).await.map(drop),
            ]
        })
        .expect("the poll waits");

    let expected = [
        None,
        Some(io::ErrorKind::NotFound),
        None,
        Some(io::ErrorKind::ConnectionRefused),
    ];
    for (index, (outcome, expected)) in outcomes.iter().zip(expected).enumerate() {
        assert_eq!(
            outcome.as_ref().err().map(io::Error::kind),
            expected,
            "connect {index}: {outcome:?}"
        );
    }
    let accepted = unix_listener.accept().map(drop);
    assert!(accepted.is_ok(), "the unix connect reached the listener");
    assert!(TcpStream::connect(tcp_address).is_ok());
}

#[test]
fn spawn_process_is_refused() {
    let (_poll, runtime) = runtime_with(SOURCES);
    let refused = runtime
        .handle()
        .spawn_process(
            std::process::Command::new("true"),
            std::process::Stdio::null(),
            std::process::Stdio::null(),
            std::process::Stdio::null(),
        )
        .err()
        .expect("refused");
    assert_eq!(refused.kind(), io::ErrorKind::Unsupported);
    assert_eq!(
        refused.to_string(),
        "cannot run true: the mio runtime does not spawn processes"
    );
}

#[test]
fn dropping_the_runtime_releases_every_task_and_source() {
    let (_poll, runtime) = runtime_with(SOURCES);
    let shared = Arc::downgrade(&runtime.0);
    let handle = runtime.handle();
    let (source, ours, mut theirs) = stream_pair();
    let registration = handle.register_io_source(source).expect("registered");

    // Parked on a source that never becomes readable, handle held here.
    let mut reader = runtime.spawn(async move { read_some(&registration, &ours).await });
    // Parked on a timer, detached into the runtime's keeping.
    let sleeper_handle = handle.clone();
    runtime
        .spawn(async move { sleeper_handle.sleep(Duration::from_secs(3600)).await })
        .detach();
    // Holding the handle of a task that is itself parked on a timer.
    let nested_handle = handle.clone();
    let mut nested = runtime.spawn(async move {
        let child_handle = nested_handle.clone();
        nested_handle
            .spawn("child", async move {
                child_handle.sleep(Duration::from_secs(3600)).await
            })
            .await
    });
    runtime.turn();
    // Still queued, never run.
    let mut queued = runtime.spawn(std::future::pending::<()>());
    drop(handle);

    drop(runtime);
    assert!(
        matches!(poll_once(&mut reader), Poll::Ready(Err(_))),
        "a parked task the runtime dropped resolves to an error"
    );
    assert!(
        matches!(poll_once(&mut nested), Poll::Ready(Err(_))),
        "a task awaiting a dropped task resolves to an error"
    );
    assert!(
        matches!(poll_once(&mut queued), Poll::Ready(Err(_))),
        "a queued task the runtime dropped resolves to an error"
    );
    assert_eq!(
        shared.strong_count(),
        0,
        "something still holds the runtime's state"
    );
    // The reader's future owned its end of the socket pair: the peer now sees the end.
    theirs
        .set_read_timeout(Some(PATIENCE))
        .expect("a read timeout");
    let mut rest = Vec::new();
    theirs
        .read_to_end(&mut rest)
        .expect("the end of the stream");
    assert!(rest.is_empty());
}

/// Floods of signals over a peer-to-peer connection, both ends on one runtime, the receiving
/// stream's queue far smaller than a flood: the socket reader keeps stopping on a full queue
/// while the kernel has more for it. The sender sends a flood, waits until all of it has
/// arrived, then sends the next, so the last wake of every flood matters. Every signal must
/// arrive, and the loop must never sit out a wait with nothing to do before it has: progress
/// that needed a timeout would be a wake lost (the agent's loop may sleep until a timer hours
/// away).
#[test]
fn floods_behind_a_full_stream_queue_arrive_without_a_lost_wake() {
    use futures_util::StreamExt;
    use std::num::NonZeroUsize;

    const FLOODS: usize = 200;
    const FLOOD: usize = 100;
    let (mut poll, runtime) = runtime_with(SOURCES);
    let (server, client) = super::peer_to_peer(&mut poll, &runtime);

    let rule = zbus::MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .member("Tick")
        .build()
        .expect("a rule")
        .to_owned();
    let stream = runtime
        .block_on(
            &mut poll,
            zbus::MessageStream::for_match_rule(rule, &client, NonZeroUsize::new(2)),
        )
        .expect("the poll waits")
        .expect("a stream");

    // How many arrived, and the sender waiting for the count to reach the end of its flood.
    let received: Arc<Mutex<(usize, Option<Waker>)>> = Arc::default();
    let counted = received.clone();
    runtime
        .spawn(async move {
            let mut stream = stream;
            while let Some(message) = stream.next().await {
                message.expect("a signal");
                let mut count = counted.lock().expect("the count");
                count.0 += 1;
                if let Some(waker) = count.1.take() {
                    waker.wake();
                }
            }
        })
        .detach();
    let arrived = received.clone();
    runtime
        .spawn(async move {
            for flood in 1..=FLOODS {
                for n in 0..FLOOD {
                    let tick = u64::try_from(n).expect("small");
                    server
                        .emit_signal(None::<&str>, "/flood", "org.example.Flood", "Tick", &tick)
                        .await
                        .expect("a signal sent");
                }
                poll_fn(|cx| {
                    let mut count = arrived.lock().expect("the count");
                    if count.0 >= flood * FLOOD {
                        return Poll::Ready(());
                    }
                    count.1 = Some(cx.waker().clone());
                    Poll::Pending
                })
                .await;
            }
            // Kept open until every signal is read: dropping it would close the socket.
            std::future::pending::<()>().await;
        })
        .detach();

    // Nothing outside this loop takes part: a wait that ends with no event, while signals are
    // still on their way, can only be a wake the runtime lost.
    let limit = Duration::from_secs(1);
    loop {
        let count = received.lock().expect("the count").0;
        if count == FLOODS * FLOOD {
            break;
        }
        let waited = Instant::now();
        let tokens = agent_pass(&mut poll, &runtime, limit);
        assert!(
            !tokens.is_empty() || waited.elapsed() < limit,
            "the loop waited {limit:?} with nothing to do, {count} of {} signals in",
            FLOODS * FLOOD
        );
    }
}
