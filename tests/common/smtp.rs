//! A tiny SMTP sink for tests: accepts every message on 127.0.0.1 and keeps it in memory.
//! It speaks just enough SMTP (EHLO/HELO, MAIL, RCPT, DATA, RSET, NOOP, QUIT) for a real client
//! such as lettre, and offers no STARTTLS, so an opportunistic client stays in plaintext.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// One received message.
#[derive(Debug, Clone, Default)]
pub struct Received {
    pub from: String,
    pub to: Vec<String>,
    /// The DATA section with dot-stuffing undone, CRLF line ends kept.
    pub data: String,
}

pub struct SmtpSink {
    pub port: u16,
    messages: Arc<Mutex<Vec<Received>>>,
    task: tokio::task::JoinHandle<()>,
}

impl SmtpSink {
    /// Binds a free port and serves until dropped.
    pub async fn start() -> SmtpSink {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind smtp");
        let port = listener.local_addr().expect("addr").port();
        let messages = Arc::new(Mutex::new(Vec::new()));
        let store = messages.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(session(stream, store.clone()));
            }
        });
        SmtpSink {
            port,
            messages,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }

    pub fn messages(&self) -> Vec<Received> {
        self.messages.lock().expect("lock").clone()
    }

    /// Waits until at least `n` messages arrived.
    pub async fn wait_for(&self, n: usize) -> Vec<Received> {
        for _ in 0..200 {
            let m = self.messages();
            if m.len() >= n {
                return m;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!(
            "smtp sink got {} messages, wanted {n}",
            self.messages().len()
        );
    }
}

impl Drop for SmtpSink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn session(stream: TcpStream, store: Arc<Mutex<Vec<Received>>>) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read);
    let mut current = Received::default();
    if write.write_all(b"220 sink ESMTP ready\r\n").await.is_err() {
        return;
    }
    let mut line = String::new();
    loop {
        line.clear();
        match lines.read_line(&mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let cmd = line.trim_end().to_string();
        let upper = cmd.to_ascii_uppercase();
        let reply: &[u8] = if upper.starts_with("EHLO") {
            b"250-sink\r\n250-8BITMIME\r\n250 SIZE 10485760\r\n"
        } else if upper.starts_with("HELO") || upper.starts_with("NOOP") {
            b"250 ok\r\n"
        } else if upper.starts_with("RSET") {
            current = Received::default();
            b"250 ok\r\n"
        } else if upper.starts_with("MAIL FROM:") {
            current.from = address(&cmd["MAIL FROM:".len()..]);
            b"250 ok\r\n"
        } else if upper.starts_with("RCPT TO:") {
            current.to.push(address(&cmd["RCPT TO:".len()..]));
            b"250 ok\r\n"
        } else if upper == "DATA" {
            if write
                .write_all(b"354 end with <CRLF>.<CRLF>\r\n")
                .await
                .is_err()
            {
                return;
            }
            let Some(data) = read_data(&mut lines).await else {
                return;
            };
            current.data = data;
            store
                .lock()
                .expect("lock")
                .push(std::mem::take(&mut current));
            b"250 queued\r\n"
        } else if upper == "QUIT" {
            let _ = write.write_all(b"221 bye\r\n").await;
            return;
        } else {
            b"502 not implemented\r\n"
        };
        if write.write_all(reply).await.is_err() {
            return;
        }
    }
}

fn address(arg: &str) -> String {
    let arg = arg.trim();
    let end = arg.find('>').map(|i| i + 1).unwrap_or(arg.len());
    arg[..end]
        .trim_start_matches('<')
        .trim_end_matches('>')
        .to_string()
}

/// Reads DATA lines up to the lone `.`, undoing dot-stuffing.
async fn read_data<R: tokio::io::AsyncBufRead + Unpin>(lines: &mut R) -> Option<String> {
    let mut data = String::new();
    let mut line = String::new();
    loop {
        line.clear();
        if lines.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        if line == ".\r\n" || line == ".\n" {
            return Some(data);
        }
        let unstuffed = line.strip_prefix('.').unwrap_or(&line);
        data.push_str(unstuffed);
    }
}
