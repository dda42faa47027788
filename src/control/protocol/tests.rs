use super::*;
use serde_json::json;

fn unit(name: &str) -> UnitName {
    unit_name::validate(name).expect("test unit names are valid")
}

fn number_id(n: u64) -> Option<RequestId> {
    Some(RequestId::Number(n.into()))
}

#[test]
fn parses_every_command() {
    let invocation = "0123456789abcdef0123456789abcdef";
    let cases: Vec<(String, Request)> = vec![
        (
            r#"{"cmd":"watch","unit":"x.service"}"#.to_owned(),
            Request {
                id: None,
                command: Command::Watch(WatchArgs {
                    unit: unit("x.service"),
                    invocation: None,
                    spec: WatchSpec::default(),
                }),
            },
        ),
        (
            format!(r#"{{"id":1,"cmd":"watch","unit":"a@b.service","invocation":"{invocation}"}}"#),
            Request {
                id: number_id(1),
                command: Command::Watch(WatchArgs {
                    unit: unit("a@b.service"),
                    invocation: Some(invocation.to_owned()),
                    spec: WatchSpec::default(),
                }),
            },
        ),
        (
            format!(
                r#"{{"cmd":"watch","unit":"x.service","invocation":"{}"}}"#,
                invocation.to_ascii_uppercase()
            ),
            Request {
                id: None,
                command: Command::Watch(WatchArgs {
                    unit: unit("x.service"),
                    invocation: Some(invocation.to_owned()),
                    spec: WatchSpec::default(),
                }),
            },
        ),
        (
            r#"{"cmd":"watch","unit":"x.service","invocation":null}"#.to_owned(),
            Request {
                id: None,
                command: Command::Watch(WatchArgs {
                    unit: unit("x.service"),
                    invocation: None,
                    spec: WatchSpec::default(),
                }),
            },
        ),
        (
            r#"{"id":"abc","cmd":"wait","unit":"x.service","timeout_ms":1500}"#.to_owned(),
            Request {
                id: Some(RequestId::Text("abc".to_owned())),
                command: Command::Wait(WaitArgs {
                    unit: unit("x.service"),
                    timeout: Some(Duration::from_millis(1500)),
                }),
            },
        ),
        (
            r#"{"cmd":"wait","unit":"x.service"}"#.to_owned(),
            Request {
                id: None,
                command: Command::Wait(WaitArgs {
                    unit: unit("x.service"),
                    timeout: None,
                }),
            },
        ),
        (
            r#"{"cmd":"stop","unit":"x.scope","timeout_ms":18446744073709551615}"#.to_owned(),
            Request {
                id: None,
                command: Command::Stop(WaitArgs {
                    unit: unit("x.scope"),
                    timeout: Some(Duration::from_millis(u64::MAX)),
                }),
            },
        ),
        (
            r#"{"cmd":"stop","unit":"x.service","timeout_ms":0}"#.to_owned(),
            Request {
                id: None,
                command: Command::Stop(WaitArgs {
                    unit: unit("x.service"),
                    timeout: Some(Duration::ZERO),
                }),
            },
        ),
        (
            r#"{"cmd":"unwatch","unit":"x.service","id":-3}"#.to_owned(),
            Request {
                id: Some(RequestId::Number((-3i64).into())),
                command: Command::Unwatch(UnwatchArgs::unit(unit("x.service"))),
            },
        ),
        (
            r#"  {"cmd":"list"}  "#.to_owned(),
            Request {
                id: None,
                command: Command::List,
            },
        ),
        (
            "{\"cmd\":\"events\",\"id\":18446744073709551615}\r".to_owned(),
            Request {
                id: number_id(u64::MAX),
                command: Command::Events,
            },
        ),
        (
            r#"{"id":"v","cmd":"version"}"#.to_owned(),
            Request {
                id: Some(RequestId::Text("v".to_owned())),
                command: Command::Version,
            },
        ),
        (
            r#"{"cmd":"status","unit":"x.service"}"#.to_owned(),
            Request {
                id: None,
                command: Command::Status(StatusArgs {
                    unit: unit("x.service"),
                }),
            },
        ),
        (
            r#"{"cmd":"stats"}"#.to_owned(),
            Request {
                id: None,
                command: Command::Stats,
            },
        ),
    ];
    for (line, expected) in cases {
        assert_eq!(parse_request(line.as_bytes()), Ok(expected), "{line}");
    }
}

#[test]
fn rejects_bad_requests() {
    use ErrorKind::*;
    let text_id = || Some(RequestId::Text("q".to_owned()));
    // (line, recovered id, kind, a fragment the message must contain)
    let cases: Vec<(&[u8], Option<RequestId>, ErrorKind, &str)> = vec![
        (b"", None, BadJson, "not valid JSON"),
        (b"{", None, BadJson, "not valid JSON"),
        (b"{\"cmd\":\"list\"} x", None, BadJson, "trailing characters"),
        (b"{\"cmd\":\"list\"}{}", None, BadJson, "trailing characters"),
        (b"{\"cmd\":\"list\xff\"}", None, BadJson, "not valid UTF-8"),
        (b"\xc3\x28", None, BadJson, "offset 0"),
        (b"[1,2]", None, BadRequest, "must be a JSON object, not an array"),
        (b"\"list\"", None, BadRequest, "not a string"),
        (b"null", None, BadRequest, "not null"),
        (b"42", None, BadRequest, "not a number"),
        (b"{}", None, BadRequest, "missing field `cmd`"),
        (br#"{"id":"q"}"#, text_id(), BadRequest, "missing field `cmd`"),
        (br#"{"id":"q","cmd":7}"#, text_id(), BadRequest, "`cmd` must be a string"),
        (br#"{"id":"q","cmd":"frob"}"#, text_id(), UnknownCommand, "unknown command \"frob\""),
        (br#"{"cmd":"LIST"}"#, None, UnknownCommand, "unknown command"),
        (br#"{"id":null,"cmd":"list"}"#, None, BadRequest, "`id` must be a string or an integer, not null"),
        (br#"{"id":true,"cmd":"list"}"#, None, BadRequest, "not a boolean"),
        (br#"{"id":[1],"cmd":"list"}"#, None, BadRequest, "not an array"),
        (br#"{"id":{},"cmd":"list"}"#, None, BadRequest, "not an object"),
        (br#"{"id":1.5,"cmd":"list"}"#, None, BadRequest, "integer"),
        (br#"{"id":18446744073709551616,"cmd":"list"}"#, None, BadRequest, "integer"),
        (br#"{"id":1e400,"cmd":"list"}"#, None, BadJson, "out of range"),
        (br#"{"id":"q","cmd":"list","unit":"x.service"}"#, text_id(), BadRequest, "unknown field `unit`"),
        (br#"{"cmd":"events","x":1}"#, None, BadRequest, "unknown field `x`"),
        (br#"{"cmd":"version","protocol":1}"#, None, BadRequest, "unknown field `protocol`"),
        (br#"{"cmd":"stats","unit":"x.service"}"#, None, BadRequest, "unknown field `unit`"),
        (br#"{"id":"q","cmd":"watch"}"#, text_id(), BadRequest, "missing field `unit`"),
        (br#"{"cmd":"watch","unit":"x.service","unti":"y"}"#, None, BadRequest, "unknown field `unti`"),
        // The spec's fields are flattened into the watch: a field of neither is still refused.
        (br#"{"cmd":"watch","unit":"x.service","run_dir":"/run/x","gen":2,"generation":2}"#, None, BadRequest, "unknown field `generation`"),
        (br#"{"cmd":"watch","unit":5}"#, None, BadRequest, "unit name"),
        (br#"{"cmd":"watch","unit":null}"#, None, BadRequest, "unit name"),
        (br#"{"id":"q","cmd":"watch","unit":"../x.service"}"#, text_id(), InvalidUnit, "invalid character '/'"),
        (br#"{"cmd":"watch","unit":""}"#, None, InvalidUnit, "empty"),
        (br#"{"cmd":"watch","unit":"a@.service"}"#, None, InvalidUnit, "template without an instance"),
        (br#"{"cmd":"wait","unit":"x"}"#, None, InvalidUnit, "unit type suffix"),
        (br#"{"cmd":"stop","unit":"x\n.service"}"#, None, InvalidUnit, "'\\n'"),
        (br#"{"cmd":"stop","unit":"x.service\n"}"#, None, InvalidUnit, "not a unit type"),
        (br#"{"cmd":"watch","unit":"x.service","record":"r.json"}"#, None, BadRequest, "`record` needs `run_dir`"),
        (br#"{"cmd":"watch","unit":"x.service","run_dir":"/run/x","record":"../r.json"}"#, None, BadRequest, "field `record`"),
        (br#"{"cmd":"watch","unit":"x.service","run_dir":"/run/x","record":"a/b"}"#, None, BadRequest, "field `record`"),
        (br#"{"cmd":"watch","unit":"x.service","run_dir":"relative"}"#, None, BadRequest, "absolute path"),
        (br#"{"cmd":"watch","unit":"x.service","gen":0}"#, None, BadRequest, "greater than 0"),
        (br#"{"cmd":"watch","unit":"x.service","gen":-1}"#, None, BadRequest, "greater than 0"),
        (br#"{"cmd":"watch","unit":"x.service","gen":"1"}"#, None, BadRequest, "greater than 0"),
        (br#"{"cmd":"watch","unit":"x.service","launch_file":"/run/l"}"#, None, BadRequest, "`launch_file` needs `gen`"),
        (br#"{"cmd":"watch","unit":"x.service","gen":1,"launch_file":"l"}"#, None, BadRequest, "absolute path"),
        (br#"{"cmd":"watch","unit":"x.service","invocation":"abc"}"#, None, BadRequest, "32 hexadecimal digits"),
        (br#"{"cmd":"watch","unit":"x.service","invocation":"0123456789abcdef0123456789abcdeg"}"#, None, BadRequest, "32 hexadecimal"),
        (br#"{"cmd":"watch","unit":"x.service","invocation":"01234567-89ab-cdef-0123-456789abcdef"}"#, None, BadRequest, "32 hexadecimal"),
        (br#"{"cmd":"watch","unit":"x.service","invocation":7}"#, None, BadRequest, "invalid type"),
        (br#"{"cmd":"wait","unit":"x.service","timeout_ms":-1}"#, None, BadRequest, "non-negative integer"),
        (br#"{"cmd":"wait","unit":"x.service","timeout_ms":1.5}"#, None, BadRequest, "non-negative integer"),
        (br#"{"cmd":"wait","unit":"x.service","timeout_ms":"10s"}"#, None, BadRequest, "non-negative integer"),
        (br#"{"cmd":"stop","unit":"x.service","timeout_ms":18446744073709551616}"#, None, BadRequest, "non-negative integer"),
        (br#"{"cmd":"stop","unit":"x.service","timeout":5}"#, None, BadRequest, "unknown field `timeout`"),
        (br#"{"cmd":"unwatch","unit":"x.service","timeout_ms":5}"#, None, BadRequest, "unknown field `timeout_ms`"),
    ];
    for (line, id, kind, fragment) in cases {
        let shown = String::from_utf8_lossy(line);
        let err = parse_request(line).expect_err(&shown);
        assert_eq!((&err.id, err.kind), (&id, kind), "{shown}: {err}");
        assert!(err.message.contains(fragment), "{shown}: {err}");
    }
}

/// The spec is its own type but not its own object: a watch with every option is the flat line
/// clients have always sent, in the same order.
#[test]
fn a_watch_serializes_its_spec_flat() {
    let request = Request {
        id: number_id(1),
        command: Command::Watch(WatchArgs {
            unit: unit("x.service"),
            invocation: Some("0123456789abcdef0123456789abcdef".to_owned()),
            spec: WatchSpec {
                run_dir: Some("/run/x".into()),
                record: Some(RecordName::parse("r.json").expect("a valid name")),
                generation: Some(3),
                launch_file: Some("/run/x/launch-3".into()),
            },
        }),
    };
    let line = serde_json::to_string(&request).expect("serializes");
    assert_eq!(
        line,
        r#"{"id":1,"cmd":"watch","unit":"x.service","invocation":"0123456789abcdef0123456789abcdef","run_dir":"/run/x","record":"r.json","gen":3,"launch_file":"/run/x/launch-3"}"#
    );
    assert_eq!(parse_request(line.as_bytes()).expect("parses"), request);
    let bare = Request {
        id: None,
        command: Command::Watch(WatchArgs::new(unit("x.service"))),
    };
    assert_eq!(
        serde_json::to_string(&bare).expect("serializes"),
        r#"{"cmd":"watch","unit":"x.service"}"#
    );
}

/// docs/protocol.md quotes these exact lines: the errors this module makes on its own.
#[test]
fn documented_error_examples_are_accurate() {
    let spec = include_str!("../../../docs/protocol.md");
    let cases: [&[u8]; 8] = [
        br#"{"cmd":"list""#,
        br#"[1,2]"#,
        br#"{"id":null,"cmd":"list"}"#,
        br#"{"id":7,"cmd":"watch","unti":"backup.service"}"#,
        br#"{"id":12,"cmd":"frob"}"#,
        br#"{"id":13,"cmd":"watch","unit":"../etc.service"}"#,
        br#"{"id":14,"cmd":"watch","unit":"x.service","invocation":"abc"}"#,
        br#"{"id":15,"cmd":"wait","unit":"x.service","timeout_ms":-1}"#,
    ];
    for line in cases {
        let request = String::from_utf8_lossy(line);
        let answer = Response::from(parse_request(line).expect_err("documented failure"));
        let exchange = format!("> {request}\n< {}\n", answer.to_line());
        assert!(
            spec.contains(&exchange),
            "not in docs/protocol.md:\n{exchange}"
        );
    }
}

#[test]
fn version_answer_line() {
    let line = Response::ok(number_id(1), json!({ "version": Version::CURRENT })).to_line();
    let expected = format!(
        r#"{{"id":1,"ok":true,"version":{{"agent":"{}","protocol":1}}}}"#,
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(line, expected);
}

#[test]
fn unknown_command_is_reported_before_its_fields() {
    let err = parse_request(br#"{"cmd":"frob","unit":"/"}"#).expect_err("unknown");
    assert_eq!(err.kind, ErrorKind::UnknownCommand);
}

#[test]
fn error_kinds_serialize_kebab_case() {
    let all = [
        ErrorKind::BadJson,
        ErrorKind::BadRequest,
        ErrorKind::UnknownCommand,
        ErrorKind::InvalidUnit,
        ErrorKind::LineTooLong,
        ErrorKind::NotWatched,
        ErrorKind::StillRunning,
        ErrorKind::Busy,
        ErrorKind::Forbidden,
        ErrorKind::Internal,
    ];
    for kind in all {
        let wire = serde_json::to_value(kind).expect("serialize kind");
        assert_eq!(wire, json!(kind.as_str()));
        assert_eq!(serde_json::from_value::<ErrorKind>(wire).ok(), Some(kind));
    }
    assert_eq!(ErrorKind::BadJson.as_str(), "bad-json");
}

#[test]
fn response_lines() {
    #[derive(Serialize)]
    struct Listing {
        units: Vec<&'static str>,
    }
    let cases: Vec<(Response, &str)> = vec![
        (Response::ok(number_id(1), ()), r#"{"id":1,"ok":true}"#),
        (Response::ok(None, ()), r#"{"ok":true}"#),
        (
            Response::ok(
                Some(RequestId::Text("a\nb".to_owned())),
                Listing {
                    units: vec!["x.service"],
                },
            ),
            r#"{"id":"a\nb","ok":true,"units":["x.service"]}"#,
        ),
        (
            Response::ok(
                Some(RequestId::Number((-5i64).into())),
                json!({"b": 1, "a": "line\nbreak"}),
            ),
            r#"{"id":-5,"ok":true,"a":"line\nbreak","b":1}"#,
        ),
        (
            Response::error(None, ErrorKind::BadJson, "oops\n"),
            r#"{"ok":false,"error":{"kind":"bad-json","message":"oops\n"}}"#,
        ),
        (
            Response::error(number_id(u64::MAX), ErrorKind::NotWatched, "x"),
            r#"{"id":18446744073709551615,"ok":false,"error":{"kind":"not-watched","message":"x"}}"#,
        ),
        (
            Response::ok(None, json!({"ok": false})),
            r#"{"ok":false,"error":{"kind":"internal","message":"response payload uses the reserved field `ok`"}}"#,
        ),
        (
            Response::ok(None, json!([1])),
            r#"{"ok":false,"error":{"kind":"internal","message":"response payload must be a JSON object, not an array"}}"#,
        ),
    ];
    for (response, expected) in cases {
        let line = response.to_line();
        assert_eq!(line, expected);
        assert!(!line.contains('\n'));
    }
}

#[test]
fn request_errors_become_error_responses_with_their_id() {
    let err = parse_request(br#"{"id":"z","cmd":"nope"}"#).expect_err("unknown command");
    let line = Response::from(err).to_line();
    let value: Value = serde_json::from_str(&line).expect("response is JSON");
    assert_eq!(value["id"], json!("z"));
    assert_eq!(value["ok"], json!(false));
    assert_eq!(value["error"]["kind"], json!("unknown-command"));
}

#[test]
fn event_lines_wrap_objects_only() {
    let line = event_line(&json!({"unit": "x.service", "state": "gone\n"})).expect("object");
    assert_eq!(line, r#"{"event":{"state":"gone\n","unit":"x.service"}}"#);
    let error = event_line(&"text").expect_err("a string is no event");
    assert!(error.to_string().contains("not a string"), "{error}");
    let error = event_line(&[1, 2]).expect_err("an array is no event");
    assert!(error.to_string().contains("not an array"), "{error}");
}

#[test]
fn an_event_line_keeps_the_fields_in_the_order_the_event_writes_them() {
    #[derive(Serialize)]
    struct Event {
        unit: &'static str,
        cause: &'static str,
    }
    let line = event_line(&Event {
        unit: "x.service",
        cause: "exited",
    })
    .expect("object");
    assert_eq!(line, r#"{"event":{"unit":"x.service","cause":"exited"}}"#);
}

/// Drains a streamed reply, returning its line and how many pieces it took.
fn stream_all(mut reply: StreamedReply) -> (String, usize) {
    let mut out = Vec::new();
    let mut pieces = 0;
    while reply.write_next(&mut out).expect("items serialize") {
        pieces += 1;
    }
    (String::from_utf8(out).expect("JSON is UTF-8"), pieces)
}

#[test]
fn streamed_list_is_the_line_response_ok_would_build() {
    #[derive(Clone, Serialize)]
    struct View {
        unit: String,
        phase: &'static str,
        populated: Option<bool>,
    }
    let view = |n: usize| View {
        unit: format!("u{n}\n.service"),
        phase: "watching",
        populated: None,
    };
    let ids = [
        None,
        number_id(7),
        Some(RequestId::Number((-5i64).into())),
        Some(RequestId::Text("a\"b\nc".to_owned())),
    ];
    for id in ids {
        for count in [0, 1, 2, 50] {
            let views: Vec<View> = (0..count).map(view).collect();
            let eager = Response::ok(id.clone(), json!({ "units": views.clone() })).to_line();
            let (line, pieces) = stream_all(list_reply(id.clone(), views));
            assert_eq!(line, eager, "{id:?} {count}");
            // The head, one piece per item, the tail.
            assert_eq!(pieces, count + 2);
        }
    }
}

#[test]
fn streamed_items_are_serialized_only_when_asked_for() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let pulled = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&pulled);
    let items = (0..1_000_000u64).inspect(move |_| {
        counter.fetch_add(1, Ordering::Relaxed);
    });
    let mut reply = list_reply(number_id(1), items);
    assert_eq!(
        pulled.load(Ordering::Relaxed),
        0,
        "nothing before the first piece"
    );
    let mut out = Vec::new();
    assert!(reply.write_next(&mut out).expect("head"));
    assert_eq!(out, br#"{"id":1,"ok":true,"units":["#);
    assert_eq!(pulled.load(Ordering::Relaxed), 0, "the head pulls no item");
    for expected in 1..=3 {
        assert!(reply.write_next(&mut out).expect("item"));
        assert_eq!(pulled.load(Ordering::Relaxed), expected);
    }
    assert_eq!(out, br#"{"id":1,"ok":true,"units":[0,1,2"#);
}

#[test]
fn a_failing_item_ends_the_reply_with_an_error() {
    struct Item(bool);
    impl Serialize for Item {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            if self.0 {
                serializer.serialize_u8(1)
            } else {
                Err(serde::ser::Error::custom("broken item"))
            }
        }
    }
    let mut reply = list_reply(None, vec![Item(true), Item(false), Item(true)]);
    let mut out = Vec::new();
    assert!(reply.write_next(&mut out).expect("head"));
    assert!(reply.write_next(&mut out).expect("first item"));
    let err = reply.write_next(&mut out).expect_err("second item fails");
    assert_eq!((err.field, err.written), ("units", 1));
    assert!(err.to_string().contains("broken item"), "{err}");
    assert_eq!(out, br#"{"ok":true,"units":[1"#);
    // Finished: nothing more, ever.
    assert!(!reply.write_next(&mut out).expect("done"));
    assert_eq!(out, br#"{"ok":true,"units":[1"#);
}

proptest::proptest! {
    #[test]
    fn never_panics_on_arbitrary_bytes(line in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
        let _ = parse_request(&line);
    }

    #[test]
    fn never_panics_on_json_like_text(line in r#"[{}\[\]":,a-z0-9 .@\\-]{0,200}"#) {
        let _ = parse_request(line.as_bytes());
    }

    /// Objects built from the real field names and hostile values reach every validation path.
    #[test]
    fn request_shaped_objects_parse_or_fail_cleanly(
        fields in proptest::collection::vec((field_name(), json_value()), 0..6)
    ) {
        let object: Map<String, Value> = fields.into_iter().collect();
        let line = Value::Object(object).to_string();
        match parse_request(line.as_bytes()) {
            // Whatever parses must echo back as a single well-formed line.
            Ok(request) => {
                let response = Response::ok(request.id, ()).to_line();
                proptest::prop_assert!(!response.contains('\n'));
            }
            Err(error) => proptest::prop_assert!(!error.message.is_empty()),
        }
    }
}

fn field_name() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    prop_oneof![
        proptest::sample::select(vec!["id", "cmd", "unit", "invocation", "timeout_ms", "x"])
            .prop_map(str::to_owned),
        "[a-z_]{0,12}",
    ]
}

fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        proptest::sample::select(vec![
            "watch",
            "wait",
            "stop",
            "unwatch",
            "list",
            "events",
            "x.service",
            "a@.service",
            "a@b.service",
            "../x.service",
            "0123456789ABCDEF0123456789abcdef",
        ])
        .prop_map(Value::from),
        any::<String>().prop_map(Value::from),
        Just(json!([1, "x"])),
        Just(json!({"cmd": "list"})),
    ]
}

/// A bad record name is refused in the words it always was.
#[test]
fn a_bad_record_name_is_refused_with_its_reason() {
    let line = br#"{"cmd":"watch","unit":"x.service","run_dir":"/run/x","record":"../r.json"}"#;
    let err = parse_request(line).expect_err("a record name with a slash");
    assert_eq!(err.kind, ErrorKind::BadRequest);
    assert_eq!(
        err.message,
        "field `record`: invalid file name \"../r.json\": contains '/'"
    );
}
