//! The usage journal: a local append-only record that makes metering survive `kill -9`.
//!
//! Usage events wait in memory for the usage writer's next batch; a process killed in that
//! window used to lose them. The journal closes the window: every admitted request appends one
//! line when it is admitted (`a`) and one when it is settled (`s`, the whole event), each copied
//! into a memory-mapped segment file ([`segment`]), so the line is in the kernel's page cache
//! before the answer completes and a killed process loses none of it. A background thread syncs
//! the segment every sync interval, so a machine crash loses at most that window.
//!
//! Each process writes its own numbered segments (`<path>.<owner>.<n>`, `owner` drawn at start)
//! and holds a lock on `<path>.<owner>.lock` while it lives. A segment is deleted once it has
//! been rotated out and every event it mentions has been committed to the database: each queued
//! event holds the segments of its admission and of its settlement ([`Mark`]) until the usage
//! writer commits it. At start (and every few seconds after), the segments of processes whose
//! lock is free (they ended) are read: every settled event is recorded (idempotent by event id:
//! the database skips ids it has) and every admission without a settlement as
//! `counted:interrupted`, charged what its admission reserved ([`Payer`]), then they are
//! deleted. A live process's segments (the old process of a graceful upgrade, still draining)
//! are left to it.
//!
//! A journal belongs to one database. Every segment opens with a header line naming the
//! database its process wrote to ([`DatabaseIdentity`]), and a process replays only segments of
//! its own database: those of sibling instances of the same deployment, never those of another
//! deployment that shares the directory (same working directory, same default path), which are
//! left for that deployment with a warning naming both databases.

mod segment;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};

use crate::storage::meta::DatabaseIdentity;
use crate::storage::{Db, UsageEvent};

use crate::domain::{Breakdown, LotKind};

use segment::{lines, owned_path, Segment};

/// A segment is rotated out past this size, or this age when it holds anything: old lines are
/// replayed at start (idempotently), so a segment that lives long makes the next start slower.
const SEGMENT_BYTES: u64 = 8 << 20;
const SEGMENT_AGE: Duration = Duration::from_secs(10);
/// A segment's allocated size: room past `SEGMENT_BYTES` for the lines appended before the
/// sync thread's next rotation. A line that finds it full rotates the segment itself.
const SEGMENT_CAPACITY: u64 = 16 << 20;

/// The settlement recorded for an admission whose process died before settling it.
pub const INTERRUPTED: &str = "counted:interrupted";

pub struct Journal {
    base: PathBuf,
    /// This process's name in its segment and lock file names.
    owner: String,
    /// The database this process writes to: only segments naming it are replayed here.
    database: DatabaseIdentity,
    /// The header line each of this process's segments opens with.
    header: Vec<u8>,
    /// Stopped processes of other databases whose segments were left alone: said once.
    foreign_seen: Mutex<HashSet<String>>,
    capacity: u64,
    current: ArcSwap<Segment>,
    /// Segments rotated out since the last tick: synced once more (a request may have appended
    /// to one after the rotation), then let go.
    previous: Mutex<Vec<Arc<Segment>>>,
    /// Held while a segment is replaced, so two rotations of the same segment make one.
    rotating: Mutex<()>,
    next_seq: AtomicU64,
    dirty: AtomicBool,
    /// Held for the life of the process: the `flock` on `<path>.<owner>.lock`, which tells
    /// other processes these segments are not to be swept.
    _lock: File,
}

/// A journal line whose event is not committed yet: keeps its segment on disk. Let go with
/// [`Hold::release`] once the event is committed; dropped otherwise (the process is ending with
/// the event unwritten), it marks the segment to be kept for the next start's replay.
pub struct Hold {
    segment: Arc<Segment>,
    released: bool,
}

impl Hold {
    pub fn release(mut self) {
        self.released = true;
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if !self.released {
            self.segment.keep.store(true, Ordering::Release);
        }
    }
}

/// The lines of one queued event: its admission and its settlement.
#[derive(Default)]
pub struct Mark {
    admitted: Option<Hold>,
    settled: Option<Hold>,
}

impl Mark {
    pub fn new(admitted: Option<Hold>, settled: Option<Hold>) -> Mark {
        Mark { admitted, settled }
    }

    /// The event is committed: its lines are no longer needed.
    pub fn release(self) {
        self.admitted
            .into_iter()
            .chain(self.settled)
            .for_each(Hold::release);
    }
}

/// What is known of a request when it is admitted.
#[derive(Serialize, Deserialize)]
struct Admission<'a> {
    id: &'a str,
    user_id: &'a str,
    key_id: &'a str,
    model: &'a str,
    endpoint: &'a str,
    reasoning_effort: Option<&'a str>,
    created_at: i64,
    input_estimate: u64,
    /// Absent in lines written before interrupted requests were charged.
    #[serde(default)]
    reserved: Option<Reserved>,
}

/// What a request's admission reserved: charged when its process dies before settling it, so
/// a crash never gives away what the provider may well have served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reserved {
    /// Quota tokens held (the estimate at the model's weights).
    pub tokens: u64,
    pub requests: u64,
    /// The tier's weekly allowance at admission: what the allowance can pay before lots.
    pub weekly_tokens: u64,
    pub weekly_requests: u64,
    pub unlimited: bool,
}

impl crate::json_line::WriteJson for Reserved {
    fn write_json(&self, out: &mut Vec<u8>) {
        crate::json_object!(out, {
            "tokens": self.tokens,
            "requests": self.requests,
            "weekly_tokens": self.weekly_tokens,
            "weekly_requests": self.weekly_requests,
            "unlimited": self.unlimited,
        });
    }
}

/// A breakdown as the settled line's `paid` (the derived `Paid`'s shape).
struct PaidLine<'a>(&'a Breakdown);

impl crate::json_line::WriteJson for PaidLine<'_> {
    fn write_json(&self, out: &mut Vec<u8>) {
        let b = self.0;
        crate::json_object!(out, {
            "at_ms": b.at_ms,
            "allowance_tokens": b.allowance_tokens,
            "allowance_requests": b.allowance_requests,
            "lots": LotsLine(&b.lots),
        });
    }
}

/// `(lot id, "token" | "request", amount)` triples as JSON arrays.
struct LotsLine<'a>(&'a [(String, LotKind, u64)]);

impl crate::json_line::WriteJson for LotsLine<'_> {
    fn write_json(&self, out: &mut Vec<u8>) {
        out.push(b'[');
        for (i, (id, kind, n)) in self.0.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.push(b'[');
            crate::json_line::write_str(out, id);
            out.push(b',');
            crate::json_line::write_str(out, kind.as_str());
            out.push(b',');
            crate::json_line::WriteJson::write_json(n, out);
            out.push(b']');
        }
        out.push(b']');
    }
}

/// Pays an interrupted request's reservation from its account's balance (the quota engine,
/// which keeps the hot balance in step with the database), returning the breakdown recorded
/// with its event.
pub trait Payer: Sync {
    fn pay_interrupted(
        &self,
        user_id: &str,
        event_id: &str,
        reserved: Reserved,
        created_at: i64,
    ) -> impl std::future::Future<Output = Breakdown> + Send;
}

impl<T: Payer + Send> Payer for Arc<T> {
    fn pay_interrupted(
        &self,
        user_id: &str,
        event_id: &str,
        reserved: Reserved,
        created_at: i64,
    ) -> impl std::future::Future<Output = Breakdown> + Send {
        (**self).pay_interrupted(user_id, event_id, reserved, created_at)
    }
}

/// The first line of every segment: whose database its lines belong to.
#[derive(Serialize, Deserialize)]
struct Header<'a> {
    database_id: &'a str,
    database: &'a str,
}

#[derive(Serialize, Deserialize)]
struct Paid<'a> {
    at_ms: i64,
    allowance_tokens: u64,
    allowance_requests: u64,
    /// (lot id, `token` | `request`, amount)
    #[serde(borrow)]
    lots: Vec<(&'a str, &'a str, u64)>,
}

/// A settled event, as journaled.
#[derive(Serialize, Deserialize)]
struct Settled<'a> {
    id: &'a str,
    user_id: &'a str,
    key_id: &'a str,
    model: &'a str,
    endpoint: &'a str,
    reasoning_effort: Option<&'a str>,
    input_tokens: u64,
    output_tokens: u64,
    cached_tokens: u64,
    /// Absent in lines written before weights existed, when the charge was the raw total.
    #[serde(default)]
    quota_charged: Option<u64>,
    status: u16,
    latency_ms: u64,
    ttfb_ms: Option<u64>,
    settlement: &'a str,
    deployment: Option<&'a str>,
    error_code: Option<&'a str>,
    created_at: i64,
    #[serde(borrow)]
    paid: Option<Paid<'a>>,
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "t")]
enum Line<'a> {
    #[serde(rename = "h", borrow)]
    Header(Header<'a>),
    #[serde(rename = "a", borrow)]
    Admitted(Admission<'a>),
    #[serde(rename = "s", borrow)]
    Settled(Settled<'a>),
}

impl Journal {
    /// Opens `owner`'s first segment, holding its lock.
    fn open(
        base: PathBuf,
        owner: String,
        lock: File,
        capacity: u64,
        database: DatabaseIdentity,
    ) -> Result<Journal, String> {
        let mut header = serde_json::to_vec(&Line::Header(Header {
            database_id: &database.id,
            database: &database.location,
        }))
        .map_err(|e| format!("usage journal header: {e}"))?;
        header.push(b'\n');
        let first = Segment::create(segment_path(&base, &owner, 1), capacity, &header)?;
        Ok(Journal {
            base,
            owner,
            database,
            header,
            foreign_seen: Mutex::new(HashSet::new()),
            capacity,
            current: ArcSwap::from_pointee(first),
            previous: Mutex::new(Vec::new()),
            rotating: Mutex::new(()),
            next_seq: AtomicU64::new(2),
            dirty: AtomicBool::new(false),
            _lock: lock,
        })
    }

    /// Appends the admission line; the hold keeps its segment until the event is committed.
    /// Written by hand as the derived `Line::Admitted` would be (`json_line`; the replay reads
    /// it back through serde, and the tests compare the two).
    pub fn admit(&self, e: &UsageEvent, input_estimate: u64, reserved: Reserved) -> Hold {
        let mut buf = Vec::with_capacity(384);
        crate::json_object!(&mut buf, {
            "t": "a",
            "id": e.id,
            "user_id": e.user_id,
            "key_id": e.key_id,
            "model": e.model,
            "endpoint": e.endpoint,
            "reasoning_effort": e.reasoning_effort,
            "created_at": e.created_at,
            "input_estimate": input_estimate,
            "reserved": Some(reserved),
        });
        self.append(buf)
    }

    /// Appends the settled event (written by hand as the derived `Line::Settled` would be);
    /// the hold keeps its segment until the event is committed.
    pub fn settle(&self, e: &UsageEvent) -> Hold {
        let mut buf = Vec::with_capacity(512);
        crate::json_object!(&mut buf, {
            "t": "s",
            "id": e.id,
            "user_id": e.user_id,
            "key_id": e.key_id,
            "model": e.model,
            "endpoint": e.endpoint,
            "reasoning_effort": e.reasoning_effort,
            "input_tokens": e.input_tokens,
            "output_tokens": e.output_tokens,
            "cached_tokens": e.cached_tokens,
            "quota_charged": Some(e.quota_charged),
            "status": e.status,
            "latency_ms": e.latency_ms,
            "ttfb_ms": e.ttfb_ms,
            "settlement": e.settlement,
            "deployment": e.deployment,
            "error_code": e.error_code,
            "created_at": e.created_at,
            "paid": e.breakdown.as_ref().map(PaidLine),
        });
        self.append(buf)
    }

    /// Copies one line (`buf`, a JSON object) into the current segment; a full segment is
    /// rotated first.
    fn append(&self, mut buf: Vec<u8>) -> Hold {
        buf.push(b'\n');
        let mut seg = self.current.load_full();
        // Full again right after a rotation means rotating failed: the line is given up.
        for _ in 0..2 {
            if seg.put(&buf) {
                self.dirty.store(true, Ordering::Relaxed);
                return Hold {
                    segment: seg,
                    released: false,
                };
            }
            if let Err(e) = self.rotate(&seg) {
                log::warn!("usage journal: cannot rotate: {e}");
            }
            seg = self.current.load_full();
        }
        // The event still goes to the database from memory; only its crash safety is lost.
        // Said once per segment, not once per request.
        if !seg.warned.swap(true, Ordering::Relaxed) {
            log::error!(
                "usage journal {}: full, lines are not kept",
                seg.path.display()
            );
        }
        Hold {
            segment: seg,
            released: false,
        }
    }

    /// Replaces `full` with a fresh segment, unless another thread has done so already.
    fn rotate(&self, full: &Arc<Segment>) -> Result<(), String> {
        let _one = self.rotating.lock().unwrap_or_else(|p| p.into_inner());
        if !Arc::ptr_eq(&self.current.load(), full) {
            return Ok(());
        }
        let n = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let next = Segment::create(
            segment_path(&self.base, &self.owner, n),
            self.capacity,
            &self.header,
        )?;
        let old = self.current.swap(Arc::new(next));
        old.retired.store(true, Ordering::Release);
        self.previous
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(old);
        Ok(())
    }

    /// Syncs what was appended since the last tick and rotates the segment when it is big or
    /// old. Runs on the journal's own thread, never on a request.
    fn tick(&self) {
        let previous =
            std::mem::take(&mut *self.previous.lock().unwrap_or_else(|p| p.into_inner()));
        for prev in previous {
            let _ = prev.sync();
        }
        let seg = self.current.load_full();
        if self.dirty.swap(false, Ordering::Relaxed) {
            if let Err(e) = seg.sync() {
                log::warn!("usage journal {}: sync failed: {e}", seg.path.display());
            }
        }
        if seg.used() >= SEGMENT_BYTES || (seg.has_lines() && seg.age() >= SEGMENT_AGE) {
            if let Err(e) = self.rotate(&seg) {
                log::warn!("usage journal: cannot rotate: {e}");
            }
        }
    }

    /// Starts the thread that syncs every `every` and rotates segments.
    pub fn spawn_syncer(self: &Arc<Self>, every: Duration) {
        let journal = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("gw-journal".into())
            .spawn(move || loop {
                std::thread::sleep(every);
                match journal.upgrade() {
                    Some(j) => j.tick(),
                    None => return,
                }
            });
        if let Err(e) = spawned {
            log::error!("usage journal: cannot start its sync thread: {e}");
        }
    }
}

fn segment_path(base: &Path, owner: &str, n: u64) -> PathBuf {
    owned_path(base, owner, &format!("{n:08}"))
}

fn lock_path(base: &Path, owner: &str) -> PathBuf {
    owned_path(base, owner, "lock")
}

/// Segments on disk under `base`, by owning process, oldest first; owners with only a lock
/// file have an empty list.
type Owners = BTreeMap<String, Vec<(u64, PathBuf)>>;

fn segments(base: &Path) -> Result<Owners, String> {
    let dir = match base.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let prefix = match base.file_name().and_then(|n| n.to_str()) {
        Some(n) => format!("{n}."),
        None => return Err(format!("bad usage journal path {}", base.display())),
    };
    let mut found = Owners::new();
    let entries =
        std::fs::read_dir(&dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((owner, tail)) = name
            .to_str()
            .and_then(|s| s.strip_prefix(&prefix))
            .and_then(|s| s.split_once('.'))
        else {
            continue;
        };
        if !owner.chars().all(|c| c.is_ascii_alphanumeric()) {
            continue;
        }
        let group = found.entry(owner.to_owned()).or_default();
        if let Ok(n) = tail.parse::<u64>() {
            group.push((n, entry.path()));
        }
    }
    for group in found.values_mut() {
        group.sort();
    }
    Ok(found)
}

/// Opens and `flock`s `owner`'s lock file; `None` while its process holds it (it is alive).
fn try_lock(base: &Path, owner: &str) -> Result<Option<File>, String> {
    let path = lock_path(base, owner);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(format!("cannot lock {}: {e}", path.display())),
    }
}

/// What a replay found and recorded.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Replayed {
    pub settled: usize,
    pub interrupted: usize,
    /// Stopped processes whose segments belong to another database, left alone.
    pub foreign: usize,
}

/// Opens this process's journal at `base`, writing for `database`. What stopped processes
/// left there is recorded by [`Journal::recover`], which the caller runs before any request
/// is admitted.
pub fn open(base: PathBuf, database: DatabaseIdentity) -> Result<Arc<Journal>, String> {
    if let Some(dir) = base.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::util::create_private_dir(dir)?;
    }
    let owner = crate::util::random_base62(10);
    let lock = try_lock(&base, &owner)?
        .ok_or_else(|| format!("usage journal {}: cannot lock a fresh file", base.display()))?;
    Ok(Arc::new(Journal::open(
        base,
        owner,
        lock,
        SEGMENT_CAPACITY,
        database,
    )?))
}

/// What one stopped process's segments hold.
struct Found {
    /// The database its header names; `None` for segments written before headers existed.
    database: Option<DatabaseIdentity>,
    settled: Vec<UsageEvent>,
    /// Admissions never settled, with what each reserved (absent in older lines).
    interrupted: Vec<(UsageEvent, Option<Reserved>)>,
}

impl Journal {
    /// Records the segments of every process that is gone (its lock is free) and wrote to this
    /// database: settled events as they were, admissions never settled as
    /// `counted:interrupted` charged their reservation through `payer`; then deletes them.
    /// Segments of live processes (an older one draining during a graceful upgrade, another
    /// instance sharing the directory) and of other databases are left alone.
    pub async fn recover<P: Payer>(&self, db: &Db, payer: &P) -> Result<Replayed, String> {
        let mut total = Replayed::default();
        for (owner, paths) in segments(&self.base)? {
            if owner == self.owner {
                continue;
            }
            let Some(lock) = try_lock(&self.base, &owner)? else {
                continue;
            };
            let found = read_segments(&paths)?;
            match &found.database {
                Some(theirs) if theirs.id != self.database.id => {
                    total.foreign += 1;
                    self.warn_foreign(&owner, theirs);
                    continue;
                }
                Some(_) => {}
                None if paths.is_empty() => {}
                None => log::info!(
                    "usage journal: segments of process {owner} name no database (written by \
                     an earlier version): recorded into {}",
                    self.database
                ),
            }
            total.settled += found.settled.len();
            total.interrupted += found.interrupted.len();
            let interrupted = charge_interrupted(db, payer, found.interrupted).await?;
            for chunk in found.settled.chunks(2000).chain(interrupted.chunks(2000)) {
                db.usage()
                    .insert_batch(chunk)
                    .await
                    .map_err(|e| format!("usage journal replay: {e}"))?;
            }
            for (_, path) in &paths {
                std::fs::remove_file(path)
                    .map_err(|e| format!("cannot remove replayed {}: {e}", path.display()))?;
            }
            let _ = std::fs::remove_file(lock_path(&self.base, &owner));
            drop(lock);
        }
        if total.settled + total.interrupted > 0 {
            log::info!(
                "usage journal: recorded {} settled and {} interrupted requests left by a stopped \
                 process",
                total.settled,
                total.interrupted
            );
        }
        Ok(total)
    }

    /// Says once per stopped process that its segments are another database's.
    fn warn_foreign(&self, owner: &str, theirs: &DatabaseIdentity) {
        let first = self
            .foreign_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(owner.to_owned());
        if first {
            log::warn!(
                "usage journal {}: process {owner} stopped with segments for database {theirs}, \
                 not this gateway's database {}: left alone; a gateway of that deployment \
                 records them when it starts (give each deployment its own \
                 storage.usage_journal)",
                self.base.display(),
                self.database
            );
        }
    }

    /// Every `every`, records what processes that have since ended left behind (the old
    /// process of a graceful upgrade, killed or not). Runs until the process ends.
    pub async fn recover_every<P: Payer>(self: Arc<Self>, db: Db, payer: P, every: Duration) {
        loop {
            tokio::time::sleep(every).await;
            if let Err(e) = self.recover(&db, &payer).await {
                log::warn!("usage journal sweep: {e}");
            }
        }
    }
}

/// Charges each interrupted admission what it reserved, skipping those whose event is stored
/// already (a replay cut short after its insert): paying twice would overcharge.
async fn charge_interrupted<P: Payer>(
    db: &Db,
    payer: &P,
    interrupted: Vec<(UsageEvent, Option<Reserved>)>,
) -> Result<Vec<UsageEvent>, String> {
    if interrupted.is_empty() {
        return Ok(Vec::new());
    }
    let events: Vec<UsageEvent> = interrupted.iter().map(|(e, _)| e.clone()).collect();
    let stored = db
        .usage()
        .stored_ids(&events)
        .await
        .map_err(|e| format!("usage journal replay: {e}"))?;
    let mut out = Vec::with_capacity(interrupted.len());
    for (mut event, reserved) in interrupted {
        if stored.contains(&event.id) {
            continue;
        }
        if let Some(r) = reserved {
            let paid = payer
                .pay_interrupted(&event.user_id, &event.id, r, event.created_at)
                .await;
            event.quota_charged = r.tokens;
            event.breakdown = Some(paid);
        }
        out.push(event);
    }
    Ok(out)
}

/// Reads one stopped process's segments. A line that does not parse (cut short by a machine
/// crash, or by a kill while it was being copied) is skipped.
fn read_segments(found: &[(u64, PathBuf)]) -> Result<Found, String> {
    let mut database = None;
    let mut settled: HashMap<String, UsageEvent> = HashMap::new();
    let mut admitted: HashMap<String, (UsageEvent, Option<Reserved>)> = HashMap::new();
    let mut skipped = 0usize;
    for (_, path) in found {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            // Swept by another process meanwhile.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        for line in lines(&bytes) {
            match serde_json::from_slice::<Line<'_>>(line) {
                Ok(Line::Header(h)) => {
                    database.get_or_insert_with(|| DatabaseIdentity {
                        id: h.database_id.to_owned(),
                        location: h.database.to_owned(),
                    });
                }
                Ok(Line::Admitted(a)) => {
                    admitted.insert(a.id.to_owned(), (interrupted_event(&a), a.reserved));
                }
                Ok(Line::Settled(s)) => {
                    settled.insert(s.id.to_owned(), settled_event(s));
                }
                Err(_) => skipped += 1,
            }
        }
    }
    if skipped > 0 {
        log::warn!("usage journal: skipped {skipped} unreadable lines (a torn write)");
    }
    admitted.retain(|id, _| !settled.contains_key(id));
    Ok(Found {
        database,
        settled: settled.into_values().collect(),
        interrupted: admitted.into_values().collect(),
    })
}

/// An admission never settled, before its reservation is charged (`charge_interrupted`).
fn interrupted_event(a: &Admission<'_>) -> UsageEvent {
    UsageEvent {
        id: a.id.to_owned(),
        user_id: a.user_id.to_owned(),
        key_id: a.key_id.to_owned(),
        model: a.model.to_owned(),
        endpoint: intern(a.endpoint),
        reasoning_effort: a.reasoning_effort.map(str::to_owned),
        // The reservation's input estimate: the process died after admitting the request, most
        // likely after forwarding it; the output it had delivered is not known.
        input_tokens: a.input_estimate,
        output_tokens: 0,
        cached_tokens: 0,
        // Set to the reservation once it is paid; lines without one charge nothing.
        quota_charged: 0,
        // No answer's status is known.
        status: 0,
        latency_ms: 0,
        ttfb_ms: None,
        settlement: INTERRUPTED,
        deployment: None,
        error_code: Some("interrupted"),
        created_at: a.created_at,
        breakdown: None,
    }
}

fn settled_event(s: Settled<'_>) -> UsageEvent {
    UsageEvent {
        id: s.id.to_owned(),
        user_id: s.user_id.to_owned(),
        key_id: s.key_id.to_owned(),
        model: s.model.to_owned(),
        endpoint: intern(s.endpoint),
        reasoning_effort: s.reasoning_effort.map(str::to_owned),
        input_tokens: s.input_tokens,
        output_tokens: s.output_tokens,
        cached_tokens: s.cached_tokens,
        quota_charged: s
            .quota_charged
            .unwrap_or(s.input_tokens.saturating_add(s.output_tokens)),
        status: s.status,
        latency_ms: s.latency_ms,
        ttfb_ms: s.ttfb_ms,
        settlement: intern(s.settlement),
        deployment: s.deployment.map(str::to_owned),
        error_code: s.error_code.map(intern),
        created_at: s.created_at,
        breakdown: s.paid.map(|p| Breakdown {
            user_id: s.user_id.to_owned(),
            at_ms: p.at_ms,
            allowance_tokens: p.allowance_tokens,
            allowance_requests: p.allowance_requests,
            lots: p
                .lots
                .into_iter()
                .map(|(id, kind, n)| {
                    let kind = if kind == "request" {
                        LotKind::Request
                    } else {
                        LotKind::Token
                    };
                    (id.to_owned(), kind, n)
                })
                .collect(),
        }),
    }
}

/// The event's name fields are `&'static str` (the request path never allocates them). At
/// replay each distinct text is leaked once: a handful of endpoint, settlement and error names.
fn intern(s: &str) -> &'static str {
    static SEEN: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut seen = SEEN
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(known) = seen.get(s) {
        return known;
    }
    let leaked: &'static str = Box::leak(s.to_owned().into_boxed_str());
    seen.insert(leaked);
    leaked
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST_CAPACITY: u64 = 1 << 16;

    fn database(id: &str) -> DatabaseIdentity {
        DatabaseIdentity {
            id: id.into(),
            location: format!("sqlite://{id}.db"),
        }
    }

    fn reserved(tokens: u64) -> Reserved {
        Reserved {
            tokens,
            requests: 1,
            weekly_tokens: 1000,
            weekly_requests: 0,
            unlimited: false,
        }
    }

    fn event(id: &str) -> UsageEvent {
        UsageEvent {
            id: id.into(),
            user_id: "usr_1".into(),
            key_id: "key_1".into(),
            model: "m".into(),
            endpoint: "chat_completions",
            input_tokens: 7,
            output_tokens: 3,
            status: 200,
            settlement: "provider:complete",
            error_code: None,
            created_at: 1_700_000_000_000,
            breakdown: Some(Breakdown {
                user_id: "usr_1".into(),
                at_ms: 5,
                allowance_tokens: 10,
                allowance_requests: 1,
                lots: vec![("lot_1".into(), LotKind::Request, 1)],
            }),
            ..UsageEvent::default()
        }
    }

    #[test]
    fn settled_lines_read_back_as_the_event_and_admissions_alone_as_interrupted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = dir.path().join("usage.journal");
        let held = try_lock(&base, "a").expect("lock").expect("free");
        let j = Journal::open(
            base.clone(),
            "a".into(),
            held,
            TEST_CAPACITY,
            database("d1"),
        )
        .expect("open");
        let done = event("evt_done");
        let cut = event("evt_cut");
        let _a1 = j.admit(&done, 9, reserved(20));
        let _a2 = j.admit(&cut, 11, reserved(75));
        // Bytes reserved by a writer killed before it copied its line stay zeros, and the
        // lines after them are read.
        assert!(j.current.load().put(&[0; 40]));
        let _s1 = j.settle(&done);
        // A line cut short is skipped.
        assert!(j.current.load().put(b"{\"t\":\"s\",\"id\":\"ev"));
        let found = segments(&base).expect("segments");
        assert_eq!(found.len(), 1);
        let read = read_segments(&found["a"]).expect("read");
        assert_eq!(read.database, Some(database("d1")));
        assert_eq!(read.settled, vec![done]);
        assert_eq!(read.interrupted.len(), 1);
        let (i, r) = &read.interrupted[0];
        assert_eq!(*r, Some(reserved(75)));
        assert_eq!(i.id, "evt_cut");
        assert_eq!(i.settlement, INTERRUPTED);
        assert_eq!(i.input_tokens, 11);
        assert_eq!(i.created_at, cut.created_at);
        // Another process sees these segments as a live process's.
        assert!(try_lock(&base, "a").expect("lock").is_none());
    }

    /// The lines written by hand are the derived serialization of `Line`, byte for byte.
    #[test]
    fn hand_written_lines_are_the_derived_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = dir.path().join("j");
        let lock = try_lock(&base, "h").expect("lock").expect("free");
        let j = Journal::open(
            base.clone(),
            "h".into(),
            lock,
            TEST_CAPACITY,
            database("d1"),
        )
        .expect("open");
        let mut e = event("evt_\"odd\\id\n");
        e.reasoning_effort = Some("high".into());
        e.deployment = Some("mock#0".into());
        e.ttfb_ms = Some(12);
        e.error_code = Some("provider_error");
        let r = reserved(321);
        let _a = j.admit(&e, 9, r);
        let _s = j.settle(&e);
        e.breakdown = None;
        let _s2 = j.settle(&e);
        let bytes = std::fs::read(&j.current.load().path).expect("read");
        let got: Vec<&[u8]> = lines(&bytes).skip(1).collect();
        let with_paid = event("evt_\"odd\\id\n");
        let paid = with_paid.breakdown.as_ref().map(|b| Paid {
            at_ms: b.at_ms,
            allowance_tokens: b.allowance_tokens,
            allowance_requests: b.allowance_requests,
            lots: b
                .lots
                .iter()
                .map(|(id, kind, n)| (id.as_str(), kind.as_str(), *n))
                .collect(),
        });
        let settled = |paid| {
            serde_json::to_vec(&Line::Settled(Settled {
                id: &e.id,
                user_id: &e.user_id,
                key_id: &e.key_id,
                model: &e.model,
                endpoint: e.endpoint,
                reasoning_effort: e.reasoning_effort.as_deref(),
                input_tokens: e.input_tokens,
                output_tokens: e.output_tokens,
                cached_tokens: e.cached_tokens,
                quota_charged: Some(e.quota_charged),
                status: e.status,
                latency_ms: e.latency_ms,
                ttfb_ms: e.ttfb_ms,
                settlement: e.settlement,
                deployment: e.deployment.as_deref(),
                error_code: e.error_code,
                created_at: e.created_at,
                paid,
            }))
            .expect("json")
        };
        let admitted = serde_json::to_vec(&Line::Admitted(Admission {
            id: &e.id,
            user_id: &e.user_id,
            key_id: &e.key_id,
            model: &e.model,
            endpoint: e.endpoint,
            reasoning_effort: e.reasoning_effort.as_deref(),
            created_at: e.created_at,
            input_estimate: 9,
            reserved: Some(r),
        }))
        .expect("json");
        assert_eq!(got.len(), 3);
        assert_eq!(std::str::from_utf8(got[0]), std::str::from_utf8(&admitted));
        assert_eq!(
            std::str::from_utf8(got[1]),
            std::str::from_utf8(&settled(paid))
        );
        assert_eq!(
            std::str::from_utf8(got[2]),
            std::str::from_utf8(&settled(None))
        );
    }

    #[test]
    fn a_rotated_segment_is_deleted_when_its_last_event_is_let_go() {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = dir.path().join("j");
        let lock = try_lock(&base, "b").expect("lock").expect("free");
        let j = Journal::open(
            base.clone(),
            "b".into(),
            lock,
            TEST_CAPACITY,
            database("d1"),
        )
        .expect("open");
        let held = j.admit(&event("evt_1"), 1, reserved(1));
        let unwritten = j.admit(&event("evt_2"), 1, reserved(1));
        let path = held.segment.path.clone();
        j.rotate(&held.segment).expect("rotate");
        j.tick();
        assert!(path.exists(), "an event still mentions it");
        held.release();
        assert!(path.exists(), "another event still mentions it");
        unwritten.release();
        assert!(!path.exists());
        assert_eq!(segments(&base).expect("segments")["b"].len(), 1);

        // A hold dropped without its event committed (the process ending) keeps its segment.
        let lost = j.admit(&event("evt_3"), 1, reserved(1));
        let path = lost.segment.path.clone();
        j.rotate(&lost.segment).expect("rotate");
        j.tick();
        drop(lost);
        assert!(path.exists());
    }

    #[test]
    fn a_line_that_finds_its_segment_full_rotates_it_and_every_line_is_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = dir.path().join("j");
        let lock = try_lock(&base, "c").expect("lock").expect("free");
        // Room for a few lines a segment.
        let j = Journal::open(base.clone(), "c".into(), lock, 1024, database("d1")).expect("open");
        let mut holds = Vec::new();
        for n in 0..20 {
            let e = event(&format!("evt_{n}"));
            holds.push(j.admit(&e, 1, reserved(1)));
            holds.push(j.settle(&e));
        }
        let found = segments(&base).expect("segments");
        assert!(found["c"].len() > 3, "{:?}", found["c"]);
        let read = read_segments(&found["c"]).expect("read");
        assert_eq!(read.settled.len(), 20);
        assert!(read.interrupted.is_empty());
        assert!(holds
            .iter()
            .all(|h| !h.segment.warned.load(Ordering::Relaxed)));
    }
}
