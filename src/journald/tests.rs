use super::*;
use crate::control::wire::Cause;

/// Splits a native-protocol datagram into its fields, as journald reads it.
fn parse(mut bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut fields = Vec::new();
    while !bytes.is_empty() {
        let end = bytes
            .iter()
            .position(|b| *b == b'\n' || *b == b'=')
            .expect("a field name ends");
        let name = String::from_utf8(bytes[..end].to_vec()).expect("a UTF-8 name");
        let value;
        if bytes[end] == b'=' {
            let rest = &bytes[end + 1..];
            let stop = rest.iter().position(|b| *b == b'\n').expect("a newline");
            value = rest[..stop].to_vec();
            bytes = &rest[stop + 1..];
        } else {
            let rest = &bytes[end + 1..];
            let len = u64::from_le_bytes(rest[..8].try_into().expect("8 bytes")) as usize;
            value = rest[8..8 + len].to_vec();
            assert_eq!(rest[8 + len], b'\n', "a binary value ends with a newline");
            bytes = &rest[8 + len + 1..];
        }
        fields.push((name, value));
    }
    fields
}

fn field<'a>(fields: &'a [(String, Vec<u8>)], name: &str) -> Option<&'a [u8]> {
    fields
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_slice())
}

#[test]
fn a_value_without_a_newline_is_name_equals_value() {
    let mut out = Vec::new();
    encode_field(&mut out, "MESSAGE", b"proven: instance exited");
    assert_eq!(out, b"MESSAGE=proven: instance exited\n");
}

#[test]
fn a_value_with_a_newline_is_sent_with_its_length() {
    let mut out = Vec::new();
    encode_field(&mut out, "MESSAGE", b"line one\nline=two");
    let mut expected = b"MESSAGE\n".to_vec();
    expected.extend_from_slice(&17u64.to_le_bytes());
    expected.extend_from_slice(b"line one\nline=two\n");
    assert_eq!(out, expected);
    assert_eq!(
        parse(&out),
        [("MESSAGE".to_owned(), b"line one\nline=two".to_vec())]
    );
}

fn unit_record(f: impl FnOnce(&log::Record<'_>)) {
    let values = [
        ("unit", "backup.service"),
        ("invocation", ""),
        ("cause", Cause::Exited.name()),
    ];
    f(&log::Record::builder()
        .args(format_args!("backup.service: proven:\ntwo lines"))
        .level(log::Level::Warn)
        .target("exitproof::agent")
        .file(Some("src/agent/mod.rs"))
        .line(Some(7))
        .key_values(&values)
        .build());
}

#[test]
fn a_record_about_a_unit_carries_it_as_fields_and_leaves_out_empty_ones() {
    unit_record(|record| {
        let fields = parse(&datagram(record));
        assert_eq!(
            field(&fields, "MESSAGE"),
            Some(&b"backup.service: proven:\ntwo lines"[..])
        );
        assert_eq!(field(&fields, "PRIORITY"), Some(&b"4"[..]));
        assert_eq!(field(&fields, "SYSLOG_IDENTIFIER"), Some(&b"exitproof"[..]));
        assert_eq!(
            field(&fields, "CODE_MODULE"),
            Some(&b"exitproof::agent"[..])
        );
        assert_eq!(field(&fields, "CODE_LINE"), Some(&b"7"[..]));
        assert_eq!(
            field(&fields, "EXITPROOF_UNIT"),
            Some(&b"backup.service"[..])
        );
        assert_eq!(field(&fields, "EXITPROOF_CAUSE"), Some(&b"exited"[..]));
        assert_eq!(field(&fields, "EXITPROOF_INVOCATION"), None, "empty");
    });
}

#[test]
fn the_cause_field_is_spelled_as_on_the_wire() {
    for cause in [
        Cause::Exited,
        Cause::ReplacedAfterStop,
        Cause::RestartedOutside,
        Cause::Rebooted,
    ] {
        assert_eq!(
            serde_json::to_value(cause).expect("serialize"),
            cause.name(),
            "{cause:?}"
        );
    }
}

/// A socket bound where journald's would be (in a temporary directory kept with it), and a
/// [`Journald`] addressing it.
struct FakeJournald {
    dir: tempfile::TempDir,
    receiver: UnixDatagram,
    journald: Journald,
}

impl FakeJournald {
    fn bind() -> FakeJournald {
        let dir = tempfile::tempdir().expect("a temp dir");
        let receiver = UnixDatagram::bind(dir.path().join("socket")).expect("bind");
        let journald = Journald::connect(&dir.path().join("socket")).expect("connect");
        FakeJournald {
            dir,
            receiver,
            journald,
        }
    }

    /// Sends the unit record and returns the fields the receiver got.
    fn round_trip(&self) -> Vec<(String, Vec<u8>)> {
        unit_record(|record| assert!(self.journald.send(record).expect("sent")));
        let mut buffer = vec![0; 4096];
        let n = self.receiver.recv(&mut buffer).expect("receive");
        parse(&buffer[..n])
    }
}

#[test]
fn a_record_reaches_a_socket_bound_where_the_journal_would_be() {
    let fields = FakeJournald::bind().round_trip();
    assert_eq!(
        field(&fields, "EXITPROOF_UNIT"),
        Some(&b"backup.service"[..])
    );
    assert_eq!(
        field(&fields, "MESSAGE"),
        Some(&b"backup.service: proven:\ntwo lines"[..])
    );
}

#[test]
fn a_full_journal_drops_and_counts_instead_of_blocking() {
    let fake = FakeJournald::bind();
    let before = dropped();
    let mut sent = 0;
    // Nobody reads: the receiver's queue fills, and sends stop being taken (never blocking).
    let full = (0..100_000).any(|_| {
        let mut taken = true;
        unit_record(|record| taken = fake.journald.send(record).expect("no hard error"));
        sent += 1;
        !taken
    });
    assert!(full, "{sent} records all taken");
    assert!(dropped() > before);
}

#[test]
fn no_journald_socket_is_an_error_the_caller_falls_back_on() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let error = Journald::connect(&dir.path().join("absent")).expect_err("no socket");
    assert_eq!(error.kind(), io::ErrorKind::NotFound);
}

#[test]
fn records_reach_a_journald_restarted_since_the_agent_started() {
    let mut fake = FakeJournald::bind();
    let path = fake.dir.path().join("socket");
    std::fs::remove_file(&path).expect("remove the old socket");
    fake.receiver = UnixDatagram::bind(&path).expect("bind again");
    assert_eq!(
        field(&fake.round_trip(), "EXITPROOF_UNIT"),
        Some(&b"backup.service"[..])
    );
}
