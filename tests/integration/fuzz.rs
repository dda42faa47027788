//! Time-bounded fuzzing of the two parsers that take hostile input: exit records (tenant-written
//! files) and control requests (socket lines). It must never leave anything behind and never
//! run longer than its time budget.
//!
//! Each target runs for `EXITPROOF_FUZZ_SECONDS` (default 2, so a plain `cargo test` stays fast;
//! CI sets more) on random bytes, JSON-shaped text, and mutations (bit flips, insertions,
//! deletions, truncation, splicing) of the seeds in `tests/fuzz_corpus/`. The run's seed is
//! printed; `EXITPROOF_FUZZ_SEED=<seed>` replays the same inputs in the same order. A failing
//! input is printed, escaped, in the panic message.

use std::env;
use std::fmt::Debug;
use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use exitproof::control::protocol::{Command, Request, Response, parse_request};
use exitproof::exit::{self, RECORD_LIMIT, SanitizedRecord};
use exitproof::proof::Level;
use exitproof::unit_name::{self, UnitName};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{Map, Value};

const DEFAULT_SECONDS: u64 = 2;

/// A field a parser knows: its name, how often a shaped object has it, and typical values
/// (as JSON text).
struct Field {
    name: &'static str,
    presence: f64,
    values: &'static [&'static str],
}

const RECORD_SHAPE: &[Field] = &[
    Field {
        name: "result",
        presence: 0.8,
        values: &[
            r#""success""#,
            r#""exit-code""#,
            r#""signal""#,
            r#""core-dump""#,
            r#""""#,
        ],
    },
    Field {
        name: "code",
        presence: 0.8,
        values: &[r#""exited""#, r#""killed""#, r#""dumped""#, "0"],
    },
    Field {
        name: "status",
        presence: 0.8,
        values: &[
            r#""0""#,
            r#""3""#,
            r#""KILL""#,
            r#""TERM\n""#,
            r#""aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa""#,
            r#""日本""#,
        ],
    },
    Field {
        name: "x",
        presence: 0.2,
        values: &["null", "[1]", r#"{"status":"0"}"#],
    },
];

const REQUEST_SHAPE: &[Field] = &[
    Field {
        name: "id",
        presence: 0.5,
        values: &["1", "-3", r#""a\nb""#, "18446744073709551615", "1.5"],
    },
    Field {
        name: "cmd",
        presence: 0.95,
        values: &[
            r#""watch""#,
            r#""wait""#,
            r#""stop""#,
            r#""unwatch""#,
            r#""list""#,
            r#""events""#,
            r#""stats""#,
            r#""status""#,
        ],
    },
    Field {
        name: "unit",
        presence: 0.8,
        values: &[
            r#""x.service""#,
            r#""a@b.service""#,
            r#""-.slice""#,
            r#""a@.service""#,
            r#""../x.service""#,
        ],
    },
    Field {
        name: "invocation",
        presence: 0.15,
        values: &[r#""0123456789ABCDEF0123456789abcdef""#, r#""abc""#, "null"],
    },
    Field {
        name: "timeout_ms",
        presence: 0.2,
        values: &["0", "30000", "18446744073709551615", "-1", "null"],
    },
    Field {
        name: "run_dir",
        presence: 0.1,
        values: &[r#""/run/x""#, r#""run/x""#, r#""""#],
    },
    Field {
        name: "record",
        presence: 0.1,
        values: &[r#""exit-1.json""#, r#""..""#, r#""a/b""#],
    },
    Field {
        name: "gen",
        presence: 0.1,
        values: &["3", "0", r#""3""#],
    },
    Field {
        name: "launch_file",
        presence: 0.05,
        values: &[r#""/var/lib/x/launch-3""#, r#""launch""#],
    },
    Field {
        name: "x",
        presence: 0.05,
        values: &["1"],
    },
];

/// Fragments worth inserting into JSON: structure, escapes, limits, invalid UTF-8, a BOM.
const TOKENS: &[&[u8]] = &[
    b"\"",
    b"\\",
    b"\\u0000",
    b"\\ud800",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"null",
    b"1e400",
    b"-0",
    b"\xff",
    b"\xc3",
    b"\xef\xbb\xbf",
    b"\"status\":",
    b"\"cmd\":\"watch\",",
    b"\"unit\":\"x.service\",",
    b"\n",
];

/// How long each target runs and from which seed.
struct Budget {
    duration: Duration,
    seed: u64,
}

impl Budget {
    fn from_env() -> Budget {
        let seconds = match env::var("EXITPROOF_FUZZ_SECONDS") {
            Ok(text) => text
                .parse()
                .unwrap_or_else(|_| panic!("EXITPROOF_FUZZ_SECONDS={text:?} is not a number")),
            Err(_) => DEFAULT_SECONDS,
        };
        let seed = match env::var("EXITPROOF_FUZZ_SEED") {
            Ok(text) => text
                .parse()
                .unwrap_or_else(|_| panic!("EXITPROOF_FUZZ_SEED={text:?} is not a number")),
            Err(_) => {
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |since| since.as_nanos() as u64)
                    ^ u64::from(std::process::id())
            }
        };
        Budget {
            duration: Duration::from_secs(seconds),
            seed,
        }
    }

    fn runner(&self) -> TestRunner {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&self.seed.to_le_bytes());
        // XorShift must not be seeded with all zeros; this half is non-zero when the other is.
        bytes[8..].copy_from_slice(&(self.seed ^ 0x9e37_79b9_7f4a_7c15).to_le_bytes());
        let config = Config {
            failure_persistence: None,
            ..Config::default()
        };
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::XorShift, &bytes))
    }
}

/// Runs `check` on inputs drawn from `inputs` until the time budget is spent, and panics with
/// the escaped input and the seed on the first failure or panic. `check` returns whether the
/// parser accepted the input, so the run can say how deep its inputs reached.
fn fuzz(
    target: &str,
    inputs: impl Strategy<Value = Vec<u8>>,
    check: impl Fn(&[u8]) -> Result<bool, String>,
) {
    let budget = Budget::from_env();
    let seed = budget.seed;
    eprintln!("{target}: seed {seed}, {:?}", budget.duration);
    let mut runner = budget.runner();
    let deadline = Instant::now() + budget.duration;
    let mut count: u64 = 0;
    let mut accepted: u64 = 0;
    while Instant::now() < deadline {
        let input = inputs
            .new_tree(&mut runner)
            .unwrap_or_else(|reason| panic!("{target}: no input: {reason}"))
            .current();
        count += 1;
        let failure = match panic::catch_unwind(AssertUnwindSafe(|| check(&input))) {
            Ok(Ok(parsed)) => {
                accepted += u64::from(parsed);
                continue;
            }
            Ok(Err(message)) => message,
            Err(payload) => payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".to_owned()),
        };
        panic!(
            "{target}: input #{count} failed: {failure}\ninput: b\"{}\"\n\
             replay with EXITPROOF_FUZZ_SEED={seed}",
            input.escape_ascii()
        );
    }
    eprintln!("{target}: {count} inputs, {accepted} accepted, seed {seed}");
}

/// The seed files whose names start with `prefix`.
fn corpus(prefix: &str) -> Arc<Vec<Vec<u8>>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_corpus");
    let mut seeds = Vec::new();
    for entry in fs::read_dir(&dir).expect("read tests/fuzz_corpus") {
        let path = entry.expect("corpus entry").path();
        let is_seed = path
            .file_name()
            .and_then(|name| name.to_str())
            .is_some_and(|name| name.starts_with(prefix));
        if is_seed {
            seeds.push(fs::read(&path).expect("read a corpus file"));
        }
    }
    assert!(!seeds.is_empty(), "no {prefix}* seeds in {}", dir.display());
    seeds.sort();
    Arc::new(seeds)
}

/// One edit of an input.
#[derive(Clone, Debug)]
enum Mutation {
    FlipBit(Index, u8),
    Insert(Index, u8),
    InsertToken(Index, &'static [u8]),
    Delete(Index, usize),
    Truncate(Index),
    /// Keeps the input up to a cut and appends another seed from a cut on.
    Splice(Index, Index, Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<Index>(), 0..8u8).prop_map(|(at, bit)| Mutation::FlipBit(at, bit)),
        (any::<Index>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Insert(at, byte)),
        (any::<Index>(), select(TOKENS)).prop_map(|(at, token)| Mutation::InsertToken(at, token)),
        (any::<Index>(), 1..16usize).prop_map(|(at, len)| Mutation::Delete(at, len)),
        any::<Index>().prop_map(Mutation::Truncate),
        (any::<Index>(), any::<Index>(), any::<Index>())
            .prop_map(|(other, cut, other_cut)| Mutation::Splice(other, cut, other_cut)),
    ]
}

impl Mutation {
    fn apply(&self, mut data: Vec<u8>, corpus: &[Vec<u8>]) -> Vec<u8> {
        // A position between bytes, 0 to len inclusive (Index::index needs a non-zero size).
        let gap = |at: &Index, data: &[u8]| at.index(data.len() + 1);
        match self {
            Mutation::FlipBit(at, bit) => {
                if !data.is_empty() {
                    let position = at.index(data.len());
                    data[position] ^= 1 << bit;
                }
            }
            Mutation::Insert(at, byte) => {
                let position = gap(at, &data);
                data.insert(position, *byte);
            }
            Mutation::InsertToken(at, token) => {
                let position = gap(at, &data);
                data.splice(position..position, token.iter().copied());
            }
            Mutation::Delete(at, len) => {
                let start = gap(at, &data);
                let end = (start + len).min(data.len());
                data.drain(start..end);
            }
            Mutation::Truncate(at) => {
                let position = gap(at, &data);
                data.truncate(position);
            }
            Mutation::Splice(other, cut, other_cut) => {
                let other = &corpus[other.index(corpus.len())];
                let cut = gap(cut, &data);
                data.truncate(cut);
                data.extend_from_slice(&other[gap(other_cut, other)..]);
            }
        }
        data
    }
}

/// A seed with one to three mutations applied (more would rarely leave it parsable).
fn mutated(corpus: Arc<Vec<Vec<u8>>>) -> impl Strategy<Value = Vec<u8>> {
    (any::<Index>(), vec(mutation(), 1..4)).prop_map(move |(seed, mutations)| {
        let start = corpus[seed.index(corpus.len())].clone();
        mutations
            .iter()
            .fold(start, |data, mutation| mutation.apply(data, &corpus))
    })
}

/// The typical values of a field, parsed.
fn typical_values(field: &Field) -> Vec<Value> {
    field
        .values
        .iter()
        .map(|text| serde_json::from_str(text).expect("a shape's values are JSON"))
        .collect()
}

/// Any JSON value, a few levels deep, with `typical` among its leaves.
fn json_value(typical: Vec<Value>) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        select(typical),
        "[A-Za-z0-9_-]{0,40}".prop_map(Value::from),
        any::<String>().prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::Array),
            vec(("[a-z_]{0,8}", inner), 0..4)
                .prop_map(|fields| Value::Object(fields.into_iter().collect())),
        ]
    })
}

/// A JSON object as text, with any of `shape`'s names (or others, some repeated) and any
/// values.
fn json_object(shape: &'static [Field]) -> impl Strategy<Value = Vec<u8>> {
    let names: Vec<&str> = shape.iter().map(|field| field.name).collect();
    let typical: Vec<Value> = shape.iter().flat_map(typical_values).collect();
    let name = prop_oneof![
        3 => select(names).prop_map(str::to_owned),
        1 => "[a-z_]{0,8}",
    ];
    vec((name, json_value(typical)), 0..8).prop_map(|members| object_text(&members))
}

/// A JSON object as text with each of `shape`'s fields present as often as the shape says,
/// mostly with a typical value: close enough to valid to get past the parser's first checks.
fn shaped_object(shape: &'static [Field]) -> impl Strategy<Value = Vec<u8>> {
    let typical: Vec<Value> = shape.iter().flat_map(typical_values).collect();
    let fields: Vec<BoxedStrategy<Option<(String, Value)>>> = shape
        .iter()
        .map(|field| {
            let value = prop_oneof![
                7 => select(typical_values(field)),
                1 => json_value(typical.clone()),
            ];
            let member = value.prop_map(|value| (field.name.to_owned(), value));
            proptest::option::weighted(field.presence, member).boxed()
        })
        .collect();
    fields.prop_map(|members| object_text(&members.into_iter().flatten().collect::<Vec<_>>()))
}

/// Writes members as a JSON object, keeping their order and any repeated name.
fn object_text(members: &[(String, Value)]) -> Vec<u8> {
    let members: Vec<String> = members
        .iter()
        .map(|(name, value)| format!("{}:{value}", Value::from(name.as_str())))
        .collect();
    format!("{{{}}}", members.join(",")).into_bytes()
}

/// Everything a target is fed: raw bytes, JSON-ish text, JSON objects, mutated seeds.
fn inputs(
    max_bytes: usize,
    shape: &'static [Field],
    corpus: Arc<Vec<Vec<u8>>>,
) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => vec(any::<u8>(), 0..max_bytes),
        1 => r#"[{}\[\]":,a-z0-9 .@\\-]{0,300}"#.prop_map(String::into_bytes),
        2 => json_object(shape),
        2 => shaped_object(shape),
        4 => mutated(corpus),
    ]
}

/// Whether `token` is what `record_token` may return: `?` or 1 to 32 bytes of `[A-Za-z0-9_-]`.
fn is_token(token: &str) -> bool {
    token == "?"
        || ((1..=32).contains(&token.len())
            && token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
}

/// Checks the line and level of `record`: a clean end (result `success`, or an exit 0) is
/// info and anything else warn; every field shown is a token.
fn check_exit_line(
    line: &str,
    level: Level,
    record: Option<&exit::ExitRecord>,
) -> Result<(), String> {
    if !line.bytes().all(|b| b.is_ascii_graphic() || b == b' ') || line.contains(['"', '\\']) {
        return Err(format!("line has unsafe characters: {line:?}"));
    }
    let has_record = record.is_some();
    let clean_end =
        record.is_some_and(|r| r.result == "success" || (r.code == "exited" && r.status == "0"));
    if (level == Level::Info) != clean_end {
        return Err(format!("level {level:?} for {line:?} of {record:?}"));
    }
    let clean = line == "instance exited (exit 0)";
    let no_record = line == "instance exited (status unknown: no exit record)";
    if no_record == has_record {
        return Err(format!("{line:?} with a record: {has_record}"));
    }
    let tokens: Vec<&str> = if clean || no_record {
        Vec::new()
    } else if let Some(signal) = line.strip_prefix("instance exited: signal ") {
        vec![signal]
    } else if let Some(result) = line
        .strip_prefix("instance exited (status unknown: ")
        .and_then(|rest| rest.strip_suffix(')'))
    {
        vec![result]
    } else if let Some(rest) = line.strip_prefix("instance exited: exit ") {
        let (status, result) = rest
            .strip_suffix(')')
            .and_then(|rest| rest.split_once(" ("))
            .ok_or_else(|| format!("unexpected line {line:?}"))?;
        vec![status, result]
    } else {
        return Err(format!("unexpected line {line:?}"));
    };
    match tokens.iter().find(|token| !is_token(token)) {
        Some(token) => Err(format!("token {token:?} in {line:?}")),
        None => Ok(()),
    }
}

fn check_record(bytes: &[u8]) -> Result<bool, String> {
    let record = exit::parse_record(bytes);
    if record.is_some() && (bytes.len() > RECORD_LIMIT || std::str::from_utf8(bytes).is_err()) {
        return Err(format!("accepted {} bytes or invalid UTF-8", bytes.len()));
    }
    let line = exit::exit_line(record.as_ref());
    let level = exit::exit_level(record.as_ref());
    check_exit_line(&line, level, record.as_ref())?;
    if let Some(record) = &record {
        let sanitized = SanitizedRecord::from(record);
        for field in [&sanitized.result, &sanitized.code, &sanitized.status] {
            if !is_token(field) {
                return Err(format!("sanitized field {field:?}"));
            }
        }
    }
    Ok(record.is_some())
}

fn same<T: PartialEq + Debug>(what: &str, parsed: T, sent: T) -> Result<(), String> {
    if parsed == sent {
        Ok(())
    } else {
        Err(format!("{what}: parsed {parsed:?}, sent {sent:?}"))
    }
}

fn check_unit(unit: &UnitName, fields: &Map<String, Value>) -> Result<(), String> {
    unit_name::validate(unit.as_str()).map_err(|e| format!("accepted unit: {e}"))?;
    same(
        "unit",
        Some(unit.as_str()),
        fields.get("unit").and_then(Value::as_str),
    )
}

/// A field that is absent or null parses as `None`.
fn sent_str<'a>(fields: &'a Map<String, Value>, name: &str) -> Option<&'a str> {
    fields.get(name).and_then(Value::as_str)
}

/// Checks that an accepted request carries what the line said.
fn check_accepted(bytes: &[u8], request: &Request) -> Result<(), String> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("accepted invalid JSON: {e}"))?;
    let Value::Object(fields) = value else {
        return Err("accepted a non-object".to_owned());
    };
    same(
        "cmd",
        Some(request.command.name()),
        sent_str(&fields, "cmd"),
    )?;
    let id = request.id.as_ref().map(serde_json::to_value);
    same(
        "id",
        id.transpose().ok().flatten().as_ref(),
        fields.get("id"),
    )?;
    match &request.command {
        Command::Watch(args) => {
            check_unit(&args.unit, &fields)?;
            same(
                "invocation",
                args.invocation.clone(),
                sent_str(&fields, "invocation").map(str::to_ascii_lowercase),
            )?;
            if let Some(name) = &args.spec.record {
                exitproof::record_name::RecordName::parse(name.as_str())
                    .map_err(|e| format!("accepted {e}"))?;
            }
            if let Some(dir) = &args.spec.run_dir {
                same("absolute run_dir", dir.is_absolute(), true)?;
            }
        }
        Command::Wait(args) | Command::Stop(args) => {
            check_unit(&args.unit, &fields)?;
            same(
                "timeout_ms",
                args.timeout.map(|timeout| timeout.as_millis()),
                fields
                    .get("timeout_ms")
                    .and_then(Value::as_u64)
                    .map(u128::from),
            )?;
        }
        Command::Unwatch(args) => match &args.unit {
            Some(unit) => check_unit(unit, &fields)?,
            None => same(
                "proven",
                Some(true),
                fields.get("proven").and_then(Value::as_bool),
            )?,
        },
        Command::Status(args) => check_unit(&args.unit, &fields)?,
        Command::Start(args) => check_unit(&args.unit, &fields)?,
        Command::List | Command::Events | Command::Version | Command::Stats => {
            let extra = fields.keys().find(|name| *name != "id" && *name != "cmd");
            same("extra field", extra, None)?;
        }
    }
    let response = Response::ok(request.id.clone(), ()).to_line();
    if response.contains('\n') {
        return Err(format!("response spans lines: {response:?}"));
    }
    Ok(())
}

fn check_request(bytes: &[u8]) -> Result<bool, String> {
    match parse_request(bytes) {
        Ok(request) => check_accepted(bytes, &request).map(|()| true),
        Err(error) if error.message.is_empty() => Err(format!("empty message: {error:?}")),
        Err(_) => Ok(false),
    }
}

#[test]
fn fuzz_parse_record() {
    let corpus = corpus("record-");
    let inputs = inputs(RECORD_LIMIT + 64, RECORD_SHAPE, corpus);
    fuzz("parse_record", inputs, check_record);
}

#[test]
fn fuzz_parse_request() {
    let corpus = corpus("request-");
    let inputs = inputs(1024, REQUEST_SHAPE, corpus);
    fuzz("parse_request", inputs, check_request);
}

/// The seeds themselves parse, so the mutations start from inputs that reach deep.
#[test]
fn corpus_seeds_are_valid() {
    for seed in corpus("record-").iter() {
        assert!(
            exit::parse_record(seed).is_some(),
            "b\"{}\"",
            seed.escape_ascii()
        );
    }
    let accepted = corpus("request-")
        .iter()
        .filter(|seed| parse_request(seed).is_ok())
        .count();
    // One request seed is deliberately invalid (an unknown field).
    assert_eq!(accepted, corpus("request-").len() - 1);
}
