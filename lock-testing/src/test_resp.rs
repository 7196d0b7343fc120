//! Raw RESP over TCP for the unit tests of this module (no client library in between).

use std::io::{self, Read, Write};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `args` as a RESP array of bulk strings.
pub(crate) fn resp(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
    }
    out
}

/// Length of the first complete reply in `buf`, if there is one.
pub(crate) fn reply_len(buf: &[u8]) -> Option<usize> {
    let line_end = buf.windows(2).position(|w| w == b"\r\n")?;
    let header = std::str::from_utf8(&buf[1..line_end]).ok()?;
    let after = line_end + 2;
    match buf.first()? {
        b'+' | b'-' | b':' => Some(after),
        b'$' => {
            let len: i64 = header.parse().ok()?;
            if len < 0 {
                return Some(after);
            }
            let end = after + len as usize + 2;
            (buf.len() >= end).then_some(end)
        }
        b'*' => {
            let len: i64 = header.parse().ok()?;
            let mut at = after;
            for _ in 0..len.max(0) {
                at += reply_len(&buf[at..])?;
            }
            Some(at)
        }
        _ => None,
    }
}

fn reply_text(buf: &[u8]) -> String {
    let text = String::from_utf8_lossy(buf);
    text.strip_suffix("\r\n").unwrap_or(&text).to_owned()
}

/// Sends one command and returns its reply, without the final CRLF (`+PONG`, `$-1`, ...).
pub(crate) fn sync_cmd(stream: &mut std::net::TcpStream, args: &[&str]) -> String {
    stream.write_all(&resp(args)).expect("write command");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(len) = reply_len(&buf) {
            return reply_text(&buf[..len]);
        }
        let n = stream.read(&mut chunk).expect("read reply");
        assert!(n > 0, "connection closed before the reply");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Reads one reply from an async stream.
pub(crate) async fn read_reply(stream: &mut tokio::net::TcpStream) -> io::Result<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(len) = reply_len(&buf) {
            return Ok(reply_text(&buf[..len]));
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Sends one command and reads its reply.
pub(crate) async fn async_cmd(
    stream: &mut tokio::net::TcpStream,
    args: &[&str],
) -> io::Result<String> {
    stream.write_all(&resp(args)).await?;
    read_reply(stream).await
}
