//! The commands a server runs, as `MONITOR` reports them: what a test cannot see in
//! `INFO commandstats` (a command's arguments, and which ran inside a script).

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One command the server ran.
#[derive(Debug, Clone)]
pub struct Command {
    /// Run by a script (`[0 lua]`), not sent by a client.
    pub in_script: bool,
    /// The command's name (upper-cased as sent) and its arguments.
    pub args: Vec<String>,
    /// When the server ran it, in seconds of its clock (wall time, microseconds).
    pub at: f64,
}

/// A `MONITOR` connection read by a thread of its own until the value is dropped.
pub struct Monitor {
    stream: TcpStream,
    seen: Arc<Mutex<Vec<Command>>>,
}

impl Monitor {
    /// Starts monitoring the server at `addr`; returns once the server has confirmed it, so
    /// every command from then on is seen.
    pub fn start(addr: SocketAddr) -> Self {
        let mut stream = TcpStream::connect(addr).expect("monitor connects");
        stream.set_read_timeout(Some(Duration::from_secs(10))).ok();
        stream.write_all(b"MONITOR\r\n").expect("MONITOR sent");
        let mut reader = BufReader::new(stream.try_clone().expect("monitor stream"));
        let mut line = String::new();
        reader.read_line(&mut line).expect("MONITOR confirmed");
        assert_eq!(line.trim_end(), "+OK", "MONITOR refused");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        std::thread::spawn(move || {
            let mut line = String::new();
            while matches!(reader.read_line(&mut line), Ok(n) if n > 0) {
                if let Some(command) = parse(&line) {
                    sink.lock().unwrap().push(command);
                }
                line.clear();
            }
        });
        Self { stream, seen }
    }

    /// Every command seen so far.
    pub fn commands(&self) -> Vec<Command> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        // Ends the reading thread.
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// `+1700000000.123456 [0 127.0.0.1:5555] "EVALSHA" "ab12" "1"`, arguments quoted with `\"`
/// and `\\` escaped (other escapes are kept as they are: no test argument has them).
fn parse(line: &str) -> Option<Command> {
    let rest = line.strip_prefix('+')?;
    let (at, rest) = rest.split_once(" [")?;
    let (source, rest) = rest.split_once("] ")?;
    let mut args = Vec::new();
    let mut chars = rest.trim_end().chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut arg = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some(e @ ('"' | '\\')) => arg.push(e),
                    Some(e) => {
                        arg.push('\\');
                        arg.push(e);
                    }
                    None => break,
                },
                c => arg.push(c),
            }
        }
        args.push(arg);
    }
    Some(Command {
        in_script: source.ends_with(" lua"),
        args,
        at: at.parse().ok()?,
    })
}
