//! The thread count of a process that runs a zbus connection on the mio runtime: it must stay
//! at one, the main thread, through connecting, method calls, a signal and a method timeout.
//!
//! A binary of its own without the test harness (`harness = false`), since the harness runs
//! every test on a thread of its own; it must never start a thread itself.

mod common;

use std::time::Duration;

use common::{Agent, PATIENCE, PrivateBus, bus_id_and_names, connect, signal_round_trip};

/// The number of threads of this process, from `/proc/self/status`.
fn thread_count() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("Threads:"))
        .and_then(|count| count.trim().parse().ok())
        .expect("a Threads line in /proc/self/status")
}

fn main() {
    let before = thread_count();
    let bus = PrivateBus::start();
    let mut agent = Agent::new();
    let handle = agent.runtime.handle();

    let (listener, emitter, timed_out) = agent
        .runtime
        .block_on(&mut agent.poll, async {
            let listener = connect(handle.clone(), bus.address(), PATIENCE).await?;
            let emitter =
                connect(handle.clone(), bus.address(), Duration::from_millis(200)).await?;
            bus_id_and_names(&listener).await?;
            // A call to a connection that never answers, which ends in the method timeout.
            let silent = listener.unique_name().map(|name| name.to_string());
            let timed_out = emitter
                .call_method(
                    silent,
                    "/org/exitproof/Silent",
                    None::<&str>,
                    "Nothing",
                    &(),
                )
                .await;
            let timed_out = matches!(
                timed_out,
                Err(zbus::Error::InputOutput(e)) if e.kind() == std::io::ErrorKind::TimedOut
            );

            Ok::<_, zbus::Error>((listener, emitter, timed_out))
        })
        .expect("the poll waits")
        .expect("the bus answers");
    assert!(timed_out, "the unanswered call did not time out");

    agent.poke();
    let task = agent
        .runtime
        .spawn(signal_round_trip(listener, emitter, "threads"));
    let received = agent.run_until_finished(task).expect("the round trip");
    assert_eq!(received, "threads");
    assert!(
        agent.own_events >= 1,
        "the agent's own event reached the agent"
    );
    let during = thread_count();

    drop(agent);
    drop(bus);
    let after = thread_count();

    println!("threads: before {before}, with live connections {during}, after {after}");
    assert_eq!(before, 1, "the harness-free binary starts with one thread");
    assert_eq!(during, before, "the connection started a thread");
    assert_eq!(after, before, "a thread outlived the connection");
    println!("threads: 1 passed, 0 failed");
}
