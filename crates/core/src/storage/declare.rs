//! How a store declares its SQL: every statement is a named constant made by `queries!`, and
//! every row it reads is a `#[derive(sqlx::FromRow)]` struct made by `row!`. Both record what
//! `storage::check` needs to hold each statement against a migrated SQLite and a migrated
//! Postgres: the text, and the names and types of the columns its rows are read into.
//!
//! Why runtime statements checked by a test rather than sqlx's compile-time macros: the stores
//! run over `sqlx::Any`, so one text serves both databases, and `query!`/`query_as!` check a
//! text against exactly one driver named by `DATABASE_URL` (they do not support `Any`). Two
//! copies of every statement, one per driver, would be the price of compile-time checks; one
//! copy prepared against both databases in CI checks the same things (tables, columns, types,
//! nullability) without it.
//!
//! `row!` exists because `FromRow`'s derive exposes no list of the fields it reads: the check
//! must compare a statement's columns with the struct itself, not with a second hand-kept list.

/// Declares a row struct: `#[derive(sqlx::FromRow)]` over the fields as written, plus (for the
/// check) their names and types. Fields have the types the `Any` driver decodes on both
/// databases (`i64`, `String`, and `Option`s of them); the store converts a row into its
/// public record.
macro_rules! row {
    ($(#[$attr:meta])* $vis:vis struct $name:ident { $($field:ident: $ty:ty,)* }) => {
        $(#[$attr])*
        #[derive(Debug, sqlx::FromRow)]
        $vis struct $name {
            $($field: $ty,)*
        }

        #[cfg(test)]
        impl $crate::storage::check::Shape for $name {
            const COLUMNS: &'static [$crate::storage::check::Column] = &[
                $($crate::storage::check::Column::of::<$ty>(Some(stringify!($field))),)*
            ];
        }
    };
}

/// Declares a store's statements as `pub(crate)` constants, `NAME -> Row = "SQL";` for a
/// statement whose rows are read into `Row` (a `row!` struct or a scalar) and `NAME = "SQL";`
/// for one that returns none, plus `ALL`, the list `storage::check` prepares on both databases.
macro_rules! queries {
    ($($(#[$attr:meta])* $name:ident $(-> $row:ty)? = $sql:expr;)*) => {
        $($(#[$attr])* pub(crate) const $name: &str = $sql;)*

        /// Every statement above, with the columns its rows are read into.
        #[cfg(test)]
        pub(crate) const ALL: &[$crate::storage::check::Query] = &[
            $($crate::storage::check::Query {
                name: stringify!($name),
                sql: $name,
                columns: queries!(@columns $($row)?),
            },)*
        ];
    };
    (@columns) => { None };
    (@columns $row:ty) => {
        Some(<$row as $crate::storage::check::Shape>::COLUMNS)
    };
}
