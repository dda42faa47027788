//! The platform, as a client of the agent: it watches the units it launched (by name or by
//! alias, with or without the invocation, a generation and a launch file), stops, waits,
//! unwatches and lists; and it remembers what the agent acknowledged, which is what the agent
//! then owes it. The harness hands each request it makes to the agent.

use std::collections::{BTreeMap, BTreeSet};

use super::kernel::Inv;
use super::oracle::{Oracle, parse_inv};
use super::rng::Rng;
use super::unit::SvcState;
use super::world::{World, hex};
use crate::agent::core::{Answer, ReplyTo};
use crate::control::ClientId;
use crate::control::protocol::RequestId;

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

/// A request the agent has not answered yet, and how long it has waited without faults.
#[derive(Debug)]
struct Unanswered {
    /// The command and its unit, for the report.
    what: String,
    /// The request's own timeout (`stop`, `wait`): the answer may wait that long.
    timeout_us: u64,
    quiet_us: u64,
    quiet_steps: u32,
}

/// How long past its own timeout a request may wait for its answer once faults stop: `watch`
/// is answered after the watch's first read, `stop` and `wait` at the proof or their timeout,
/// the rest at once (or after the save they wait for).
const ANSWER_BOUND_US: u64 = 20_000_000;

/// And in how many steps without faults at least: the model's systemd answers a read a
/// property a step (13 for a service), and a watch made with an alias reads twice, or three
/// times if the unit begins another invocation while it is read (seen: 51 steps).
const ANSWER_STEPS: u32 = 60;

/// A request of the platform's, numbered, on its current connection.
pub(crate) struct Request {
    pub id: u64,
    pub client: ClientId,
    pub json: serde_json::Value,
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
    /// Every request on the current connection the agent owes an answer, by id.
    unanswered: BTreeMap<u64, Unanswered>,
}

impl Tenant {
    /// The platform's connections died with the agent: no answer comes to what was asked.
    pub(crate) fn agent_died(&mut self) {
        self.asked.clear();
        self.unanswered.clear();
    }

    /// A step without faults passed, of `us` of virtual time: every request still unanswered
    /// past its timeout and the bound, and past [`ANSWER_STEPS`] such steps, is reported, once.
    /// `reads_busy`: every read the agent may have out is with systemd at the step's end. Such a
    /// step is systemd's time, not the agent's, for a request with no timeout of its own (a
    /// `watch`, answered after its reads): the model's systemd answers a property a step, and
    /// with one read at a time a new watch's reads queue behind every other watch's
    /// (86376599874571: 61 steps). A request with a timeout is answered at it, reads or not.
    pub(crate) fn quiet_step(&mut self, us: u64, reads_busy: bool) -> Vec<String> {
        let mut late = Vec::new();
        self.unanswered.retain(|id, waiting| {
            if reads_busy && waiting.timeout_us == 0 {
                return true;
            }
            waiting.quiet_us += us;
            waiting.quiet_steps += 1;
            let over = waiting.quiet_us > waiting.timeout_us + ANSWER_BOUND_US
                && waiting.quiet_steps > ANSWER_STEPS;
            if over {
                late.push(format!(
                    "NO ANSWER to request {id} ({}): {} steps, {} s without faults",
                    waiting.what,
                    waiting.quiet_steps,
                    waiting.quiet_us / 1_000_000
                ));
            }
            !over
        });
        late
    }

    /// Request `id` never reached the agent (it was down): no answer is owed.
    pub(crate) fn not_sent(&mut self, id: u64) {
        self.asked.remove(&id);
        self.unanswered.remove(&id);
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
        if let Some(id) = n.as_u64() {
            self.unanswered.remove(&id);
        }
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
        if let Some(path) = &asked.launch_file {
            self.launch_files.insert(path.clone(), Some((unit, inv)));
        }
        if asked.unwatched {
            return;
        }
        self.held.insert(asked.name, Held { unit, inv });
        if view.proof.is_none() {
            oracle.owe(unit, inv);
            if let Some(path) = &asked.launch_file {
                oracle.owe_launch_file(path, unit, inv);
            }
        }
    }

    /// `json` numbered as the platform's next request on its current connection.
    fn numbered(&mut self, mut json: serde_json::Value) -> Request {
        self.next_id += 1;
        json["id"] = self.next_id.into();
        let field = |name: &str| json.get(name).and_then(serde_json::Value::as_str);
        let what = format!(
            "{} {}",
            field("cmd").unwrap_or("?"),
            field("unit").unwrap_or("")
        );
        let timeout_ms = json.get("timeout_ms").and_then(serde_json::Value::as_u64);
        self.unanswered.insert(
            self.next_id,
            Unanswered {
                what: what.trim_end().to_owned(),
                timeout_us: timeout_ms.unwrap_or(0) * 1000,
                quiet_us: 0,
                quiet_steps: 0,
            },
        );
        Request {
            id: self.next_id,
            client: ClientId::for_test(self.client),
            json,
        }
    }

    /// A new connection of the platform, subscribed to proofs.
    pub(crate) fn subscribe(&mut self) -> Request {
        self.client += 1;
        self.numbered(serde_json::json!({"cmd": "events"}))
    }

    /// The platform does one thing: the request it sends.
    pub(crate) fn act(&mut self, rng: &mut Rng, world: &World, oracle: &mut Oracle) -> Request {
        let names: Vec<String> = self.held.keys().cloned().collect();
        let pick = |rng: &mut Rng| names[rng.below(names.len())].clone();
        let json = match rng.weighted(&[12, 4, 2, 2, 1]) {
            Some(0) => return self.watch(rng, world),
            Some(1) if !names.is_empty() => {
                let name = pick(rng);
                self.stops.insert(name.clone());
                let timeout = 1000 * (1 + rng.below(30));
                serde_json::json!({"cmd": "stop", "unit": name, "timeout_ms": timeout})
            }
            Some(2) if !names.is_empty() => {
                let name = pick(rng);
                serde_json::json!({"cmd": "wait", "unit": name, "timeout_ms": 5000})
            }
            Some(3) if !names.is_empty() => {
                let name = pick(rng);
                if let Some(held) = self.held.remove(&name) {
                    oracle.forgive(held.unit, held.inv);
                }
                for asked in self.asked.values_mut() {
                    asked.unwatched |= asked.name == name;
                }
                serde_json::json!({"cmd": "unwatch", "unit": name})
            }
            _ => serde_json::json!({"cmd": "list"}),
        };
        self.numbered(json)
    }

    /// Watches a unit as a platform would: right after launching it, with the invocation it
    /// read, or late (an older invocation), or adopting whatever runs.
    fn watch(&mut self, rng: &mut Rng, world: &World) -> Request {
        let mut u = rng.below(world.units.len());
        // Some seeds' platform often watches late: a unit that already runs, or already
        // exited and remains (RemainAfterExit), its cgroup pruned.
        let late: Vec<usize> = (0..world.units.len())
            .filter(|i| {
                let unit = &world.units[*i];
                unit.loaded && matches!(unit.state, SvcState::Exited | SvcState::Running)
            })
            .collect();
        if world.swarm.late_watches && rng.percent(60) {
            u = rng.pick(&late).unwrap_or(u);
        }
        let unit = &world.units[u];
        // By an alias only while systemd resolves it: a watch that names an invocation under a
        // name systemd knows no unit by is proven at its first read (the agent cannot tell it
        // from a unit collected after that invocation ended; docs/rules.md).
        let name = match unit.aliases.first() {
            Some(alias) if unit.aliases_linked && rng.percent(50) => alias.clone(),
            _ => unit.name.clone(),
        };
        let older: Vec<Inv> = world
            .history
            .iter()
            .filter(|(_, r)| r.unit == u)
            .map(|(inv, _)| *inv)
            .collect();
        let inv = match rng.below(10) {
            0 | 1 => None,
            2 => rng.pick(&older),
            _ => Some(unit.invocation).filter(|i| *i != 0),
        };
        let mut json = serde_json::json!({"cmd": "watch", "unit": name});
        if let Some(inv) = inv {
            json["invocation"] = hex(inv).into();
        }
        let mut launch_file = None;
        if rng.percent(60) {
            self.next_gen += 1;
            json["gen"] = self.next_gen.into();
            if rng.percent(60) {
                let path = format!("/run/launch/{name}.{}", self.next_gen);
                json["launch_file"] = path.clone().into();
                self.launch_files.insert(path.clone(), None);
                launch_file = Some(path);
            }
        }
        let request = self.numbered(json);
        self.asked.insert(
            request.id,
            Asked {
                name,
                launch_file,
                unwatched: false,
            },
        );
        request
    }
}
