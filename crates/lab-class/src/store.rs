//! The board's data, in PostgreSQL, in a schema of its own (`lab_class`): the class code and the
//! instructor's token, the learners who joined, and every verdict they sent (the history; a
//! cell of the grid is the newest verdict of its learner, exercise and check).
//!
//! On a throwaway server the board lasts one lesson; on a server given with `--database-url` it
//! lasts a course: the same code and token come back when `lab class` starts again. The board
//! touches nothing outside its schema.

use sqlx::PgPool;

use crate::model::{Joined, Kind, Reason, Schedule, VerdictPost};

/// The schema every table of the board lives in.
pub const SCHEMA: &str = "lab_class";

/// Who sent a verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The learner's own `lab` ran the checks and said so: the board takes its word.
    SelfReported,
    /// The instructor's `lab class verify` ran them against the learner's running service.
    Verified,
}

impl Source {
    fn word(self) -> &'static str {
        match self {
            Source::SelfReported => "self",
            Source::Verified => "verified",
        }
    }

    fn from_word(word: &str) -> Source {
        if word == "verified" {
            Source::Verified
        } else {
            Source::SelfReported
        }
    }
}

/// One stored verdict: a cell of the grid, or a line of a learner's history.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Stored {
    /// The row's id: the newest verdict of a cell has the largest.
    pub id: i64,
    pub learner: i64,
    pub exercise: String,
    pub check: String,
    pub verdict: Kind,
    pub source: Source,
    pub reason_key: Option<String>,
    pub reason: Option<Reason>,
    pub replay: Option<String>,
    /// Seconds since the board received it.
    pub age_s: f64,
    /// When, in UTC (RFC 3339).
    pub received_at: String,
}

/// A learner who joined.
#[derive(Debug, Clone)]
pub struct Learner {
    pub id: i64,
    pub name: String,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the board's database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("the name `{0}` is taken in this class")]
    NameTaken(String),
    #[error("no learner `{0}` in this class")]
    NoLearner(String),
}

/// The board's tables.
#[derive(Clone)]
pub struct Store {
    pool: PgPool,
    pub class_code: String,
    pub instructor_token: String,
}

/// The class code learners type: six characters, no 0/O or 1/I to mistake for each other.
fn new_class_code() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHJKLMNPQRSTUVWXYZ23456789";
    uuid::Uuid::new_v4().as_bytes()[..6]
        .iter()
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect()
}

/// A secret: 122 random bits from a v4 UUID, as 32 hex digits.
pub fn new_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// What the board keeps of a learner's token: it cannot post with it.
fn token_hash(token: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

const TABLES: &[&str] = &[
    "CREATE SCHEMA IF NOT EXISTS lab_class",
    // One row: the class's code and the instructor's token, kept so a board on a server that
    // lasts (--database-url) keeps them across restarts.
    "CREATE TABLE IF NOT EXISTS lab_class.board (
        only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
        class_code text NOT NULL,
        instructor_token text NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now())",
    "CREATE TABLE IF NOT EXISTS lab_class.learners (
        id bigserial PRIMARY KEY,
        name text NOT NULL,
        token_sha256 text NOT NULL UNIQUE,
        joined_at timestamptz NOT NULL DEFAULT now())",
    // One name per class, whatever its case: "ann" cannot pass for "Ann".
    "CREATE UNIQUE INDEX IF NOT EXISTS learners_name ON lab_class.learners (lower(name))",
    "CREATE TABLE IF NOT EXISTS lab_class.verdicts (
        id bigserial PRIMARY KEY,
        learner_id bigint NOT NULL REFERENCES lab_class.learners (id),
        exercise text NOT NULL,
        check_name text NOT NULL,
        verdict text NOT NULL CHECK (verdict IN ('pass', 'fail', 'unknown')),
        source text NOT NULL CHECK (source IN ('self', 'verified')),
        reason_key text,
        reason_en text,
        reason_ru text,
        replay text,
        -- A line per row; a line has no line break (the post is checked for it).
        schedule_en text,
        schedule_ru text,
        received_at timestamptz NOT NULL DEFAULT now())",
    // The newest verdict of a cell is the first row of its index range.
    "CREATE INDEX IF NOT EXISTS verdicts_cell
        ON lab_class.verdicts (learner_id, exercise, check_name, id DESC)",
];

const STORED_COLUMNS: &str = "id, learner_id, exercise, check_name, verdict, source, reason_key, \
     reason_en, reason_ru, replay, extract(epoch FROM now() - received_at)::float8, \
     to_char(received_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')";

type StoredRow = (
    i64,
    i64,
    String,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    f64,
    String,
);

fn stored(
    (id, learner, exercise, check, verdict, source, reason_key, en, ru, replay, age_s, at): StoredRow,
) -> Stored {
    Stored {
        id,
        learner,
        exercise,
        check,
        // The table's CHECK admits only these words.
        verdict: Kind::from_word(&verdict).unwrap_or(Kind::Unknown),
        source: Source::from_word(&source),
        reason_key,
        reason: en.zip(ru).map(|(en, ru)| Reason { en, ru }),
        replay,
        age_s,
        received_at: at,
    }
}

impl Store {
    /// The board's tables in `pool`'s database, created if they are not there; the class code
    /// and token they hold, or new ones.
    pub async fn open(pool: PgPool) -> Result<Store, StoreError> {
        for statement in TABLES {
            sqlx::query(*statement).execute(&pool).await?;
        }
        sqlx::query(
            "INSERT INTO lab_class.board (class_code, instructor_token) VALUES ($1, $2)
             ON CONFLICT (only_row) DO NOTHING",
        )
        .bind(new_class_code())
        .bind(new_token())
        .execute(&pool)
        .await?;
        let (class_code, instructor_token): (String, String) =
            sqlx::query_as("SELECT class_code, instructor_token FROM lab_class.board")
                .fetch_one(&pool)
                .await?;
        Ok(Store {
            pool,
            class_code,
            instructor_token,
        })
    }

    /// A new learner named `name` (already checked), with a token of their own.
    pub async fn join(&self, name: &str) -> Result<Joined, StoreError> {
        let token = new_token();
        let inserted: Result<(i64,), sqlx::Error> = sqlx::query_as(
            "INSERT INTO lab_class.learners (name, token_sha256) VALUES ($1, $2) RETURNING id",
        )
        .bind(name)
        .bind(token_hash(&token))
        .fetch_one(&self.pool)
        .await;
        match inserted {
            Ok((learner,)) => Ok(Joined {
                learner,
                name: name.to_string(),
                token,
            }),
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                Err(StoreError::NameTaken(name.to_string()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The learner whose token this is.
    pub async fn learner_of(&self, token: &str) -> Result<Option<Learner>, StoreError> {
        let row: Option<(i64, String)> =
            sqlx::query_as("SELECT id, name FROM lab_class.learners WHERE token_sha256 = $1")
                .bind(token_hash(token))
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|(id, name)| Learner { id, name }))
    }

    /// The learner with this display name (any case).
    pub async fn learner_named(&self, name: &str) -> Result<Learner, StoreError> {
        let row: Option<(i64, String)> =
            sqlx::query_as("SELECT id, name FROM lab_class.learners WHERE lower(name) = lower($1)")
                .bind(name)
                .fetch_optional(&self.pool)
                .await?;
        row.map(|(id, name)| Learner { id, name })
            .ok_or_else(|| StoreError::NoLearner(name.to_string()))
    }

    /// Keeps one verdict (already validated) of `learner`.
    pub async fn record(
        &self,
        learner: i64,
        post: &VerdictPost,
        source: Source,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO lab_class.verdicts
                 (learner_id, exercise, check_name, verdict, source, reason_key, reason_en,
                  reason_ru, replay, schedule_en, schedule_ru)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(learner)
        .bind(&post.exercise)
        .bind(&post.check)
        .bind(post.verdict.word())
        .bind(source.word())
        .bind(&post.reason_key)
        .bind(post.reason.as_ref().map(|r| r.en.as_str()))
        .bind(post.reason.as_ref().map(|r| r.ru.as_str()))
        .bind(&post.replay)
        .bind(post.schedule.as_ref().map(|s| s.en.join("\n")))
        .bind(post.schedule.as_ref().map(|s| s.ru.join("\n")))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Every learner, in the order they joined.
    pub async fn learners(&self) -> Result<Vec<Learner>, StoreError> {
        let rows: Vec<(i64, String)> =
            sqlx::query_as("SELECT id, name FROM lab_class.learners ORDER BY id")
                .fetch_all(&self.pool)
                .await?;
        Ok(rows
            .into_iter()
            .map(|(id, name)| Learner { id, name })
            .collect())
    }

    /// The grid: the newest verdict of every (learner, exercise, check) that has one.
    pub async fn cells(&self) -> Result<Vec<Stored>, StoreError> {
        // The columns are this module's constant; nothing of a request is in the text.
        let rows: Vec<StoredRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT DISTINCT ON (learner_id, exercise, check_name) {STORED_COLUMNS}
             FROM lab_class.verdicts
             ORDER BY learner_id, exercise, check_name, id DESC"
        )))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(stored).collect())
    }

    /// One learner's verdicts, newest first (the last `limit`).
    pub async fn history(&self, learner: i64, limit: i64) -> Result<Vec<Stored>, StoreError> {
        let rows: Vec<StoredRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {STORED_COLUMNS} FROM lab_class.verdicts
             WHERE learner_id = $1 ORDER BY id DESC LIMIT $2"
        )))
        .bind(learner)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(stored).collect())
    }

    /// The schedules of these verdicts (the examples the board shows), by id. The grid itself is
    /// read without them: it is read every second by every page.
    pub async fn schedules(&self, ids: &[i64]) -> Result<Vec<(i64, Schedule)>, StoreError> {
        let rows: Vec<(i64, String, String)> = sqlx::query_as(
            "SELECT id, schedule_en, schedule_ru FROM lab_class.verdicts
             WHERE id = ANY($1) AND schedule_en IS NOT NULL AND schedule_ru IS NOT NULL",
        )
        .bind(ids)
        .fetch_all(&self.pool)
        .await?;
        let lines = |text: &str| text.lines().map(str::to_string).collect();
        Ok(rows
            .into_iter()
            .map(|(id, en, ru)| {
                let schedule = Schedule {
                    en: lines(&en),
                    ru: lines(&ru),
                };
                (id, schedule)
            })
            .collect())
    }

    /// Whether `token` is the instructor's.
    pub fn is_instructor(&self, token: &str) -> bool {
        // Compared through their hashes: the time taken says nothing of where they differ.
        token_hash(token) == token_hash(&self.instructor_token)
    }

    /// Whether `code` is the class code (any case, spaces around it ignored).
    pub fn is_class_code(&self, code: &str) -> bool {
        token_hash(&code.trim().to_ascii_uppercase()) == token_hash(&self.class_code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_code_is_six_unmistakable_characters() {
        for _ in 0..100 {
            let code = new_class_code();
            assert_eq!(code.len(), 6);
            assert!(
                code.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit()),
                "{code}"
            );
            assert!(!code.contains(['0', 'O', '1', 'I']), "{code}");
        }
    }
}
