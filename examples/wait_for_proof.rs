//! Watches a unit, waits until every process of it is gone, then says so: the place where a
//! platform releases what the unit held. Run it beside an agent:
//! `cargo run --example wait_for_proof -- web.service [SOCKET]`.

use std::path::PathBuf;
use std::time::Duration;

use exitproof::control::client::Client;
use exitproof::control::protocol::{ErrorKind, WatchArgs};
use exitproof::unit_name::UnitName;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let unit: UnitName = args
        .next()
        .ok_or("usage: wait_for_proof UNIT [SOCKET]")?
        .parse()?;
    let socket = args.next().map_or_else(
        || PathBuf::from("/run/exitproof/exitproof.sock"),
        PathBuf::from,
    );

    let mut client = Client::connect(&socket)?;
    let watch = client.watch(WatchArgs::new(unit.clone()))?;
    println!("watching {} ({:?})", watch.unit, watch.phase);
    loop {
        match client.wait(&unit, Some(Duration::from_secs(60))) {
            Ok(answer) => {
                let event = answer.event;
                // Every process of the watched invocation is gone: release what it held here.
                println!("{}: {} ({:?})", event.unit, event.message, event.cause);
                return Ok(());
            }
            Err(e) if e.kind() == Some(ErrorKind::StillRunning) => {
                println!("{unit} still running");
            }
            Err(e) => return Err(e.into()),
        }
    }
}
