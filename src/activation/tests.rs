use std::os::fd::IntoRawFd;
use std::os::unix::net::{UnixDatagram, UnixStream};

use super::*;

#[test]
fn only_a_listen_pid_of_this_process_passes_anything() {
    assert_eq!(passed_fds(None, Some("1"), 42), Ok(None));
    assert_eq!(passed_fds(Some("41"), Some("1"), 42), Ok(None));
    assert_eq!(passed_fds(Some("42"), Some("0"), 42), Ok(None));
    assert_eq!(passed_fds(Some("42"), Some("1"), 42), Ok(Some(1)));
}

#[test]
fn malformed_or_several_sockets_are_refused_with_what_to_change() {
    let several = passed_fds(Some("42"), Some("2"), 42).expect_err("two sockets");
    assert!(several.to_string().contains("exactly one"), "{several}");
    for (pid, fds) in [("x", Some("1")), ("42", None), ("42", Some("one"))] {
        assert!(passed_fds(Some(pid), fds, 42).is_err(), "{pid} {fds:?}");
    }
}

#[test]
fn a_listening_unix_stream_socket_is_served_with_its_path() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("s.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    let activated = listener_at(listener.into_raw_fd()).expect("served");
    assert_eq!(activated.path, path);
    let flags = fcntl(&activated.listener, FcntlArg::F_GETFD).expect("flags");
    assert!(FdFlag::from_bits_truncate(flags).contains(FdFlag::FD_CLOEXEC));
    UnixStream::connect(&path).expect("it accepts connections");
}

fn refusal(fd: RawFd) -> String {
    listener_at(fd).expect_err("refused").to_string()
}

#[test]
fn anything_but_a_listening_unix_stream_socket_is_refused_clearly() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let file = std::fs::File::create(dir.path().join("f")).expect("a file");
    assert!(refusal(file.into_raw_fd()).contains("is not a socket"));

    let datagram = UnixDatagram::bind(dir.path().join("d")).expect("bind");
    assert!(refusal(datagram.into_raw_fd()).contains("not a stream socket"));

    let (connection, _peer) = UnixStream::pair().expect("a pair");
    assert!(refusal(connection.into_raw_fd()).contains("does not listen"));

    let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    assert!(refusal(tcp.into_raw_fd()).contains("is not a Unix socket"));
}
