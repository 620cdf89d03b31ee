//! A TCP relay that hands every chunk of the server's answers to the client a fixed time after
//! it arrived (a delay line: chunks keep their order and delays do not add up), as a Redis on
//! a saturated host answers: late, but it answers. Runs on its own thread until dropped.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub struct SlowRelay {
    pub port: u16,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for SlowRelay {
    /// Dropped inside a test's own runtime, where a runtime may not block to shut down.
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl SlowRelay {
    /// Relays a loopback port to `target` (`host:port`), delaying what `target` sends back.
    pub fn start(target: &str, delay: Duration) -> SlowRelay {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("relay runtime");
        // Bound here, made a tokio listener on the relay's runtime: the caller may itself be
        // inside a runtime, where blocking on another is not allowed.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("relay port");
        listener.set_nonblocking(true).expect("non-blocking");
        let port = listener.local_addr().expect("relay address").port();
        let target = target.to_string();
        runtime.spawn(async move {
            let listener = TcpListener::from_std(listener).expect("relay listener");
            while let Ok((client, _)) = listener.accept().await {
                let target = target.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&target).await {
                        relay(client, server, delay).await;
                    }
                });
            }
        });
        SlowRelay {
            port,
            runtime: Some(runtime),
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

async fn relay(client: TcpStream, server: TcpStream, delay: Duration) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
    });
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match server_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let due = tokio::time::Instant::now() + delay;
                    if tx.send((due, buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    });
    while let Some((due, chunk)) = rx.recv().await {
        tokio::time::sleep_until(due).await;
        if client_write.write_all(&chunk).await.is_err() {
            return;
        }
    }
}
