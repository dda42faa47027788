//! The mio runtime under a real zbus connection to a private dbus-daemon: method calls through
//! `block_on`, a signal through the agent's own loop, a method timeout, and what dropping the
//! runtime with a live connection releases.
//!
//! Each test must never leave its dbus-daemon or its directory behind; `PrivateBus` kills the
//! daemon by pid and removes the directory on drop, failed test or not.

use std::time::Duration;

use crate::common::{Agent, PATIENCE, PrivateBus, bus_id_and_names, connect, signal_round_trip};
use futures_util::StreamExt;
use zbus::{MatchRule, MessageStream, message::Type};

#[test]
fn connect_and_method_calls_complete_through_block_on() {
    let bus = PrivateBus::start();
    let mut agent = Agent::new();
    let handle = agent.runtime.handle();

    let (id, names, unique_name) = agent
        .runtime
        .block_on(&mut agent.poll, async {
            let connection = connect(handle, bus.address(), PATIENCE).await?;
            let (id, names) = bus_id_and_names(&connection).await?;
            let unique_name = connection.unique_name().map(|name| name.to_string());

            Ok::<_, zbus::Error>((id, names, unique_name))
        })
        .expect("the poll waits")
        .expect("the bus answers");

    assert!(
        id.len() == 32 && id.chars().all(|c| c.is_ascii_hexdigit()),
        "GetId answers a bus id, not {id:?}"
    );
    let unique_name = unique_name.expect("a bus connection has a unique name");
    for expected in ["org.freedesktop.DBus", unique_name.as_str()] {
        assert!(
            names.iter().any(|name| name == expected),
            "{expected} in {names:?}"
        );
    }
}

#[test]
fn a_signal_arrives_through_the_agent_loop() {
    let bus = PrivateBus::start();
    let mut agent = Agent::new();
    let handle = agent.runtime.handle();

    // Connecting is startup, which `block_on` is for; the signal goes through the agent's loop.
    let (listener, emitter) = agent
        .runtime
        .block_on(&mut agent.poll, async {
            let listener = connect(handle.clone(), bus.address(), PATIENCE).await?;
            let emitter = connect(handle, bus.address(), PATIENCE).await?;

            Ok::<_, zbus::Error>((listener, emitter))
        })
        .expect("the poll waits")
        .expect("both connect");

    agent.poke();
    let task = agent
        .runtime
        .spawn(signal_round_trip(listener, emitter, "hello"));
    let received = agent.run_until_finished(task).expect("the round trip");

    assert_eq!(received, "hello");
    assert!(
        agent.own_events >= 1,
        "the agent's own event reached the agent"
    );
}

#[test]
fn a_call_nobody_answers_fails_with_the_method_timeout() {
    let bus = PrivateBus::start();
    let mut agent = Agent::new();
    let handle = agent.runtime.handle();

    let (reply, delivered) = agent
        .runtime
        .block_on(&mut agent.poll, async {
            let caller = connect(handle.clone(), bus.address(), Duration::from_millis(300)).await?;
            let silent = connect(handle, bus.address(), PATIENCE).await?;
            // Takes the silent connection's messages and answers none of them.
            let mut calls = MessageStream::from(&silent);

            let reply = caller
                .call_method(
                    silent.unique_name(),
                    "/org/exitproof/Silent",
                    Some("org.exitproof.Silent"),
                    "NeverReplies",
                    &(),
                )
                .await;
            // The call did reach the silent connection: the timeout is the only answer it got.
            let mut delivered = false;
            while let Some(message) = calls.next().await {
                let message = message?;
                let header = message.header();
                if header.message_type() == Type::MethodCall
                    && header.member().map(|member| member.as_str()) == Some("NeverReplies")
                {
                    delivered = true;
                    break;
                }
            }

            Ok::<_, zbus::Error>((reply, delivered))
        })
        .expect("the poll waits")
        .expect("both connect");

    match reply {
        Err(zbus::Error::InputOutput(e)) => assert_eq!(e.kind(), std::io::ErrorKind::TimedOut),
        other => panic!("a call nobody answers should time out, got {other:?}"),
    }
    assert!(delivered, "the silent connection never saw the call");
    // What the dropped connections queued runs first; then no timer may be left.
    agent.runtime.turn();
    assert_eq!(
        agent.runtime.timeout(),
        None,
        "the timed-out call left its timer behind"
    );
}

#[test]
fn dropping_the_runtime_with_a_live_connection_closes_it() {
    let bus = PrivateBus::start();
    let mut watcher = Agent::new();
    let mut doomed = Agent::new();
    let watcher_handle = watcher.runtime.handle();
    let doomed_handle = doomed.runtime.handle();

    let doomed_connection = doomed
        .runtime
        .block_on(
            &mut doomed.poll,
            connect(doomed_handle, bus.address(), PATIENCE),
        )
        .expect("the poll waits")
        .expect("the doomed connection connects");
    let doomed_name = doomed_connection
        .unique_name()
        .expect("a bus connection has a unique name")
        .to_string();

    let mut owner_changes = watcher
        .runtime
        .block_on(&mut watcher.poll, async {
            let connection = connect(watcher_handle, bus.address(), PATIENCE).await?;
            let rule = MatchRule::builder()
                .msg_type(Type::Signal)
                .sender("org.freedesktop.DBus")
                .interface("org.freedesktop.DBus")
                .member("NameOwnerChanged")
                .arg(0, doomed_name.as_str())
                .build()?;

            MessageStream::for_match_rule(rule, &connection, None).await
        })
        .expect("the poll waits")
        .expect("the watcher subscribes");

    // A detached task that holds a clone of the connection and waits on it for good: only
    // dropping the runtime can end it.
    let keeper = doomed_connection.clone();
    zbus::runtime::traits::TaskHandle::detach(doomed.runtime.spawn(async move {
        let mut messages = MessageStream::from(&keeper);
        while messages.next().await.is_some() {}
    }));
    doomed.runtime.turn();
    drop(doomed_connection);
    drop(doomed);

    let name_released = watcher.runtime.spawn(async move {
        while let Some(message) = owner_changes.next().await {
            let (name, _old_owner, new_owner): (String, String, String) =
                message?.body().deserialize()?;
            if new_owner.is_empty() {
                return Ok(name);
            }
        }
        Err(zbus::Error::Failure("the signal stream ended".into()))
    });
    let released = watcher
        .run_until_finished(name_released)
        .expect("the bus reports the name's owner");
    assert_eq!(released, doomed_name);
}
