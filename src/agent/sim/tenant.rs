//! The platform, as a client of the agent: it watches the units it launched (by name or by
//! alias, with or without the invocation, a generation and a launch file), stops, waits,
//! unwatches and lists; and it remembers what the agent acknowledged, which is what the agent
//! then owes it.

use std::collections::{BTreeMap, BTreeSet};

use super::harness::Sim;
use super::kernel::Inv;
use super::oracle::{Oracle, parse_inv};
use super::service::SvcState;
use super::world::{World, hex};
use crate::agent::core::{Answer, Input, ReplyTo};
use crate::control::ClientId;
use crate::control::protocol::{RequestId, parse_request};

/// A watch the platform asked for.
#[derive(Clone, Debug)]
struct Asked {
    name: String,
    launch_file: Option<String>,
    /// The platform unwatched the name before the answer came: the answer owes nothing.
    unwatched: bool,
}

/// A watch the agent acknowledged.
#[derive(Clone, Debug)]
struct Held {
    unit: usize,
    inv: Inv,
}

#[derive(Debug, Default)]
pub(crate) struct Tenant {
    client: u64,
    next_id: u64,
    next_gen: u64,
    /// Watch requests not answered yet, by request id.
    asked: BTreeMap<u64, Asked>,
    held: BTreeMap<String, Held>,
    /// Each launch file named in a watch, and its generation's (unit, invocation) once known.
    launch_files: BTreeMap<String, Option<(usize, Inv)>>,
    /// Names the platform asked to stop. By name, not invocation: a stop applies to whatever
    /// watch the agent has under the name, which the platform may not know yet.
    stops: BTreeSet<String>,
}

impl Tenant {
    /// The platform's connections died with the agent: no answer comes to what was asked.
    pub(crate) fn agent_died(&mut self) {
        self.asked.clear();
    }

    /// Whether the platform ever asked to stop `name`.
    pub(crate) fn stop_requested(&self, name: &str) -> bool {
        self.stops.contains(name)
    }

    pub(crate) fn launch_file_invocation(&self, path: &str) -> Inv {
        self.launch_files
            .get(path)
            .copied()
            .flatten()
            .map_or(0, |(_, inv)| inv)
    }

    pub(crate) fn launch_file_proven(&self, path: &str, oracle: &Oracle) -> bool {
        self.launch_files
            .get(path)
            .copied()
            .flatten()
            .is_some_and(|(u, inv)| oracle.is_proven(u, inv))
    }

    /// An answer of the agent.
    pub(crate) fn on_reply(
        &mut self,
        world: &World,
        oracle: &mut Oracle,
        to: ReplyTo,
        answer: Answer,
    ) {
        let Some(RequestId::Number(n)) = to.id else {
            return;
        };
        let Some(asked) = n.as_u64().and_then(|id| self.asked.remove(&id)) else {
            return;
        };
        let Answer::Watch(view) = answer else {
            return;
        };
        let (Some(unit), Some(inv)) = (world.resolve(&asked.name), view.invocation.as_deref())
        else {
            return;
        };
        let inv = parse_inv(inv);
        if let Some(path) = asked.launch_file {
            self.launch_files.insert(path, Some((unit, inv)));
        }
        if asked.unwatched {
            return;
        }
        self.held.insert(asked.name, Held { unit, inv });
        if view.proof.is_none() {
            oracle.owe(unit, inv);
        }
    }
}

impl Sim {
    fn request(&mut self, json: serde_json::Value) -> u64 {
        self.tenant.next_id += 1;
        let id = self.tenant.next_id;
        let mut json = json;
        json["id"] = id.into();
        let request = parse_request(json.to_string().as_bytes()).expect("a valid request");
        let client = ClientId::for_test(self.tenant.client);
        let unit = json["unit"].as_str().map(str::to_owned);
        let inv = json["invocation"].as_str().map(parse_inv);
        self.asking = unit.clone().map(|u| (u, inv));
        self.input(Input::Request { client, request });
        self.asking = None;
        // A request refused at once (say, a watch with other options) made no watch: the key
        // read later (after a reconnection) under its name is the existing one.
        if let Some(unit) = unit
            && !std::mem::take(&mut self.refused).contains(&id)
        {
            self.asked_names.insert(unit, inv);
        }
        id
    }

    /// A new connection of the platform, subscribed to proofs.
    pub(crate) fn subscribe(&mut self) {
        self.tenant.client += 1;
        self.request(serde_json::json!({"cmd": "events"}));
    }

    /// The platform does one thing.
    pub(crate) fn tenant_step(&mut self) {
        let names: Vec<String> = self.tenant.held.keys().cloned().collect();
        let pick = |sim: &mut Sim| names[sim.rng.below(names.len())].clone();
        match self.rng.weighted(&[12, 4, 2, 2, 1]) {
            Some(0) => self.watch(),
            Some(1) if !names.is_empty() => {
                let name = pick(self);
                self.tenant.stops.insert(name.clone());
                let timeout = 1000 * (1 + self.rng.below(30));
                self.request(
                    serde_json::json!({"cmd": "stop", "unit": name, "timeout_ms": timeout}),
                );
            }
            Some(2) if !names.is_empty() => {
                let name = pick(self);
                self.request(serde_json::json!({"cmd": "wait", "unit": name, "timeout_ms": 5000}));
            }
            Some(3) if !names.is_empty() => {
                let name = pick(self);
                if let Some(held) = self.tenant.held.remove(&name) {
                    self.oracle.forgive(held.unit, held.inv);
                }
                for asked in self.tenant.asked.values_mut() {
                    asked.unwatched |= asked.name == name;
                }
                self.request(serde_json::json!({"cmd": "unwatch", "unit": name}));
            }
            _ => {
                self.request(serde_json::json!({"cmd": "list"}));
            }
        }
    }

    /// Watches a unit as a platform would: right after launching it, with the invocation it
    /// read, or late (an older invocation), or adopting whatever runs.
    fn watch(&mut self) {
        let mut u = self.rng.below(self.world.units.len());
        // Some seeds' platform often watches late: a unit that already runs, or already
        // exited and remains (RemainAfterExit), its cgroup pruned.
        let late: Vec<usize> = (0..self.world.units.len())
            .filter(|i| {
                let unit = &self.world.units[*i];
                unit.loaded && matches!(unit.state, SvcState::Exited | SvcState::Running)
            })
            .collect();
        if self.world.swarm.late_watches && self.rng.percent(60) {
            u = self.rng.pick(&late).unwrap_or(u);
        }
        let unit = &self.world.units[u];
        let name = match unit.aliases.first() {
            Some(alias) if self.rng.percent(50) => alias.clone(),
            _ => unit.name.clone(),
        };
        let older: Vec<Inv> = self
            .world
            .history
            .iter()
            .filter(|(_, r)| r.unit == u)
            .map(|(inv, _)| *inv)
            .collect();
        let inv = match self.rng.below(10) {
            0 | 1 => None,
            2 => self.rng.pick(&older),
            _ => Some(unit.invocation).filter(|i| *i != 0),
        };
        let mut json = serde_json::json!({"cmd": "watch", "unit": name});
        if let Some(inv) = inv {
            json["invocation"] = hex(inv).into();
        }
        let mut launch_file = None;
        if self.rng.percent(60) {
            self.tenant.next_gen += 1;
            json["gen"] = self.tenant.next_gen.into();
            if self.rng.percent(60) {
                let path = format!("/run/launch/{name}.{}", self.tenant.next_gen);
                json["launch_file"] = path.clone().into();
                self.tenant.launch_files.insert(path.clone(), None);
                launch_file = Some(path);
            }
        }
        let id = self.tenant.next_id + 1;
        self.tenant.asked.insert(
            id,
            Asked {
                name,
                launch_file,
                unwatched: false,
            },
        );
        self.request(json);
    }
}
