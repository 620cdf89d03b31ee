-- A name for this database, drawn once when it is created: state a gateway keeps outside the
-- database (the usage journal's segments) carries it, so a process only ever replays what was
-- written for the database it uses, never another deployment's sharing the same directory.
CREATE TABLE gateway_meta (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
INSERT INTO gateway_meta (name, value) VALUES ('database_id', lower(hex(randomblob(16))));
