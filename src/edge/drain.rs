//! The end of the process: which signals stop it, and the drain that waits for in-flight
//! requests before it exits.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora_core::server::{ExecutionPhase, ShutdownSignal, ShutdownSignalWatch};

use gateway_core::state::SharedState;
use gateway_devapi::in_flight::IN_FLIGHT;

/// Ends the process once shutdown has begun and nothing is in flight (or the drain deadline
/// passed), after flushing queued usage events.
pub(super) fn spawn_drain_monitor(
    mut phases: tokio::sync::broadcast::Receiver<ExecutionPhase>,
    state: SharedState,
    rt: tokio::runtime::Handle,
    drain: Duration,
    uds: PathBuf,
    pid: Arc<crate::lifecycle::PidFile>,
) {
    let handle = rt.clone();
    handle.spawn(async move {
        loop {
            match phases.recv().await {
                Ok(ExecutionPhase::GracefulTerminate) | Ok(ExecutionPhase::ShutdownGracePeriod) => {
                    break
                }
                Ok(_) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(_) => return,
            }
        }
        log::info!("shutdown: draining up to {drain:?}");
        let deadline = Instant::now() + drain;
        // Give accepted connections a moment to reach request_filter.
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Shortly before the deadline, relays still running end their answers with an error
        // in the client's style (a stream dropped by the runtime would just stop).
        let cut_at = deadline
            .checked_sub(drain.min(Duration::from_millis(500)))
            .unwrap_or(deadline);
        while IN_FLIGHT.load(Ordering::Acquire) > 0 && Instant::now() < cut_at {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if IN_FLIGHT.load(Ordering::Acquire) > 0 {
            gateway_devapi::settle::cut_in_flight();
        }
        while IN_FLIGHT.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if IN_FLIGHT.load(Ordering::Acquire) > 0 {
            // Let Pingora's grace period end and drop the rest; main flushes after that.
            return;
        }
        state
            .quota
            .give_back_leases(state.config().quota.reservation_timeout)
            .await;
        state.usage.flush().await;
        state.items.flush().await;
        gateway_devapi::accesslog::flush();
        let _ = tokio::task::spawn_blocking(gateway_telemetry::shutdown).await;
        let _ = std::fs::remove_file(&uds);
        pid.remove();
        log::info!("shutdown complete");
        std::process::exit(0);
    });
}

/// SIGTERM and SIGINT drain gracefully; SIGQUIT hands the listeners to a new process.
pub(super) struct Signals;

#[async_trait]
impl ShutdownSignalWatch for Signals {
    async fn recv(&self) -> ShutdownSignal {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int), Ok(mut quit)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
            signal(SignalKind::quit()),
        ) else {
            log::error!("cannot install signal handlers");
            return std::future::pending().await;
        };
        tokio::select! {
            _ = term.recv() => { log::info!("SIGTERM: graceful shutdown"); ShutdownSignal::GracefulTerminate }
            _ = int.recv() => { log::info!("SIGINT: graceful shutdown"); ShutdownSignal::GracefulTerminate }
            _ = quit.recv() => { log::info!("SIGQUIT: graceful upgrade"); ShutdownSignal::GracefulUpgrade }
        }
    }
}
