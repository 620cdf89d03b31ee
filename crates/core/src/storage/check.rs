//! Holds every statement of the stores against a migrated SQLite and a migrated Postgres:
//! each is described by the database itself (the call sqlx's compile-time macros make), which
//! fails on an unknown table or column, a syntax one dialect lacks, or a result type the `Any`
//! driver cannot decode (a Postgres `SUM` of `BIGINT` is `NUMERIC`), and its result columns
//! are compared with the row struct they are read into: the same names in the same order, a
//! compatible type, and (on Postgres, which knows) no NULL where the field takes none. See
//! `storage::declare` for why this is a test and not compile-time checks.
//!
//! The SQLite half always runs; the Postgres half runs as `storage::testdb` says.

use sqlx::any::AnyTypeInfoKind;
use sqlx::{Column as _, Executor};

use super::testdb::PgDatabase;
use super::{
    auth, keys, meta, payments, quota, reports, response_items, usage, users, Backend, Db,
};

/// What a result column must hold for the field it is read into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `BIGINT` (both databases): every integer, timestamp and 0/1 flag the stores keep.
    Int,
    Text,
}

/// A Rust type a column is read into, with the column type it needs.
pub(crate) trait Field {
    const KIND: Kind;
    /// Whether the field takes SQL NULL.
    const OPTIONAL: bool;
}

impl Field for i64 {
    const KIND: Kind = Kind::Int;
    const OPTIONAL: bool = false;
}

impl Field for String {
    const KIND: Kind = Kind::Text;
    const OPTIONAL: bool = false;
}

impl<T: Field> Field for Option<T> {
    const KIND: Kind = T::KIND;
    const OPTIONAL: bool = true;
}

/// One result column as the reading side expects it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Column {
    /// The field's name, which `FromRow` looks the column up by; `None` for a scalar read by
    /// position (`query_scalar`).
    pub name: Option<&'static str>,
    pub kind: Kind,
    pub optional: bool,
}

impl Column {
    pub(crate) const fn of<T: Field>(name: Option<&'static str>) -> Column {
        Column {
            name,
            kind: T::KIND,
            optional: T::OPTIONAL,
        }
    }
}

/// The columns a statement's rows are read into, in order.
pub(crate) trait Shape {
    const COLUMNS: &'static [Column];
}

/// Scalars read with `query_scalar`: one column, any name.
impl<T: Field> Shape for T {
    const COLUMNS: &'static [Column] = &[Column::of::<T>(None)];
}

/// One declared statement, for `storage::check`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Query {
    pub name: &'static str,
    pub sql: &'static str,
    /// The columns its rows are read into; `None` for a statement that returns no rows.
    pub columns: Option<&'static [Column]>,
}

/// A statement to check: its name, its text and the columns its rows are read into.
type Statement = (String, String, Option<&'static [Column]>);

/// Every statement of every store, with the built ones at their sample sizes.
fn statements(backend: Backend) -> Vec<Statement> {
    let declared = [
        users::sql::ALL,
        keys::sql::ALL,
        auth::sql::ALL,
        quota::sql::ALL,
        usage::sql::ALL,
        reports::sql::ALL,
        meta::sql::ALL,
        response_items::sql::ALL,
    ]
    .into_iter()
    .chain(payments::STATEMENTS)
    .flatten()
    .map(|q| (q.name.to_string(), q.sql.to_string(), q.columns));
    declared
        .chain(usage::built_statements(backend))
        .chain(payments::built_statements())
        .chain(response_items::built_statements(backend))
        .collect()
}

/// What is wrong with `sql` on `db`, read into `expected`: nothing when empty.
async fn problems_of(db: &Db, sql: &str, expected: Option<&[Column]>) -> Vec<String> {
    problems_and_unknowns(db, sql, expected).await.0
}

/// `problems_of`, plus how many columns the database could not give a type before running.
async fn problems_and_unknowns(
    db: &Db,
    sql: &str,
    expected: Option<&[Column]>,
) -> (Vec<String>, usize) {
    let mut conn = match db.pool.acquire().await {
        Ok(c) => c,
        Err(e) => return (vec![format!("no connection: {e}")], 0),
    };
    let described = match conn.describe(sql).await {
        Ok(d) => d,
        Err(e) => return (vec![e.to_string()], 0),
    };
    let columns = described.columns();
    let expected = expected.unwrap_or(&[]);
    let names = |cols: Vec<String>| cols.join(", ");
    if columns.len() != expected.len() {
        let problem = format!(
            "returns {} columns ({}), read into {} ({})",
            columns.len(),
            names(columns.iter().map(|c| c.name().to_string()).collect()),
            expected.len(),
            names(
                expected
                    .iter()
                    .map(|c| c.name.unwrap_or("?").to_string())
                    .collect()
            ),
        );
        return (vec![problem], 0);
    }
    let mut out = Vec::new();
    let mut unknown = 0;
    for (n, (col, want)) in columns.iter().zip(expected).enumerate() {
        let name = col.name();
        if let Some(field) = want.name.filter(|f| *f != name) {
            out.push(format!("column {n} is {name:?}, read as field {field:?}"));
        }
        let kind = col.type_info().kind();
        let fits = match want.kind {
            Kind::Int => kind == AnyTypeInfoKind::BigInt,
            Kind::Text => kind == AnyTypeInfoKind::Text,
        };
        // SQLite cannot always tell an expression's type before running it.
        if kind == AnyTypeInfoKind::Null {
            unknown += 1;
        } else if !fits {
            out.push(format!("{name} is {kind:?}, read as {:?}", want.kind));
        }
        // SQLite's answer is not usable here: it says a TEXT primary key may be NULL (it may,
        // in SQLite), which the stores never write.
        if db.backend == Backend::Postgres && described.nullable(n) == Some(true) && !want.optional
        {
            out.push(format!(
                "{name} may be NULL, read into a field that takes none"
            ));
        }
    }
    (out, unknown)
}

/// Every problem of every statement on `db`, one line each.
async fn all_problems(db: &Db) -> Vec<String> {
    let mut out = Vec::new();
    let list = statements(db.backend);
    assert!(list.len() > 80, "only {} statements found", list.len());
    let (mut columns, mut unknown) = (0, 0);
    for (name, sql, expected) in &list {
        let (problems, unknowns) = problems_and_unknowns(db, sql, *expected).await;
        columns += expected.map_or(0, <[Column]>::len);
        unknown += unknowns;
        for p in problems {
            out.push(format!("{:?} {name}: {p}", db.backend));
        }
    }
    eprintln!(
        "{:?}: {} statements, {columns} columns read, {unknown} of unknown type before running",
        db.backend,
        list.len()
    );
    out
}

async fn sqlite() -> (tempfile::TempDir, Db) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let db = Db::connect(&format!("sqlite://{}/check.db", dir.path().display()))
        .await
        .expect("migrated SQLite");
    (dir, db)
}

#[tokio::test]
async fn every_statement_fits_sqlite() {
    let (_dir, db) = sqlite().await;
    let problems = all_problems(&db).await;
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[tokio::test]
async fn every_statement_fits_postgres() {
    let Some(pg) = PgDatabase::create().await else {
        return;
    };
    let db = Db::connect(&pg.url).await.expect("migrated Postgres");
    let problems = all_problems(&db).await;
    db.pool.close().await;
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

/// The check finds what it is there to find, on each database.
#[tokio::test]
async fn the_check_reports_mismatches() {
    const ID_EMAIL: &[Column] = &[
        Column::of::<String>(Some("id")),
        Column::of::<String>(Some("email")),
    ];
    const CREATED_AS_TEXT: &[Column] = &[Column::of::<String>(Some("created_at"))];
    const LAST_LOGIN: &[Column] = &[Column::of::<i64>(Some("last_login_at"))];
    let (_dir, lite) = sqlite().await;
    let pg = PgDatabase::create().await;
    let pg_db = match &pg {
        Some(pg) => Some(Db::connect(&pg.url).await.expect("migrated Postgres")),
        None => None,
    };
    for db in std::iter::once(&lite).chain(pg_db.as_ref()) {
        let found = |sql: &'static str, cols: Option<&'static [Column]>| async move {
            problems_of(db, sql, cols).await
        };
        assert!(found("SELECT id, email FROM users", Some(ID_EMAIL))
            .await
            .is_empty());
        let order = found("SELECT email, id FROM users", Some(ID_EMAIL)).await;
        assert_eq!(order.len(), 2, "{order:?}");
        let kind = found("SELECT created_at FROM users", Some(CREATED_AS_TEXT)).await;
        assert_eq!(kind.len(), 1, "{kind:?}");
        assert!(!found("SELECT id FROM users", Some(ID_EMAIL))
            .await
            .is_empty());
        assert!(!found("SELECT id FROM users", None).await.is_empty());
        assert!(!found("UPDATE users SET no_such_column = 1", None)
            .await
            .is_empty());
        assert!(!found("SELECT id FROM no_such_table", Some(ID_EMAIL))
            .await
            .is_empty());
        if db.backend == Backend::Postgres {
            let sum = found(
                "SELECT SUM(created_at) AS created_at FROM users",
                Some(LAST_LOGIN),
            );
            assert!(!sum.await.is_empty(), "NUMERIC is caught");
            let null = found("SELECT last_login_at FROM users", Some(LAST_LOGIN)).await;
            assert_eq!(null.len(), 1, "{null:?}");
        }
    }
    if let Some(db) = pg_db {
        db.pool.close().await;
    }
}

/// No store passes SQL text to sqlx except through a declared statement (`sql::NAME`) or a
/// built one listed in `built_statements`, so `statements()` is every statement there is.
#[test]
fn stores_pass_no_undeclared_sql() {
    let literal = regex::Regex::new(
        r#"\bquery(?:_as|_scalar|_with)?(?:::<[^()]*>)?\(\s*(?:"|r#*"|&?format!)"#,
    )
    .expect("pattern");
    assert!(literal.is_match(r#"sqlx::query("SELECT 1")"#));
    assert!(literal.is_match(r#"sqlx::query_as::<_, Row>(&format!("SELECT {X}"))"#));
    assert!(!literal.is_match("sqlx::query(sql::BY_ID)"));
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/storage");
    let mut dirs = vec![root];
    let mut files = 0;
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("storage sources") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") || path.ends_with("check.rs") {
                continue;
            }
            files += 1;
            let text = std::fs::read_to_string(&path).expect("source");
            // Tests may look into the schema with SQL of their own.
            let product = text.split("\n#[cfg(test)]\nmod tests").next().unwrap_or("");
            for (n, line) in product.lines().enumerate() {
                assert!(
                    !literal.is_match(line),
                    "{}:{}: SQL outside a declared statement: {line}",
                    path.display(),
                    n + 1
                );
            }
        }
    }
    assert!(files >= 10, "read {files} files");
}
