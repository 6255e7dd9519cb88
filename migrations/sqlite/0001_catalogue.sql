-- The movie catalogue, reviews, users and their watch lists (SQLite).
CREATE TABLE movies (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    release_year INTEGER NOT NULL,
    genre TEXT NOT NULL,
    rating REAL NOT NULL CHECK (rating >= 0 AND rating <= 10)
);

CREATE TABLE movie_moods (
    movie_id INTEGER NOT NULL REFERENCES movies (id) ON DELETE CASCADE,
    mood TEXT NOT NULL CHECK (mood IN ('COMFORT', 'ADVENTURE', 'ROMANCE', 'HORROR', 'THOUGHTFUL', 'COMEDY')),
    PRIMARY KEY (movie_id, mood)
);
CREATE INDEX movie_moods_by_mood ON movie_moods (mood, movie_id);

CREATE TABLE tv_shows (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    first_air_year INTEGER NOT NULL,
    genre TEXT NOT NULL,
    rating REAL NOT NULL CHECK (rating >= 0 AND rating <= 10)
);

CREATE TABLE reviews (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    movie_id INTEGER NOT NULL REFERENCES movies (id) ON DELETE CASCADE,
    score INTEGER NOT NULL CHECK (score BETWEEN 1 AND 10),
    comment TEXT NOT NULL,
    author TEXT NOT NULL
);
CREATE INDEX reviews_by_movie ON reviews (movie_id);

CREATE TABLE users (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    created_at BIGINT NOT NULL
);

CREATE TABLE watchlist_items (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id INTEGER NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    movie_id INTEGER REFERENCES movies (id),
    tv_show_id INTEGER REFERENCES tv_shows (id),
    status TEXT NOT NULL CHECK (status IN ('WANT_TO_WATCH', 'WATCHED')),
    added_at BIGINT NOT NULL,
    CHECK ((movie_id IS NULL) <> (tv_show_id IS NULL))
);
CREATE UNIQUE INDEX watchlist_one_movie_per_user ON watchlist_items (user_id, movie_id) WHERE movie_id IS NOT NULL;
CREATE UNIQUE INDEX watchlist_one_show_per_user ON watchlist_items (user_id, tv_show_id) WHERE tv_show_id IS NOT NULL;
CREATE INDEX watchlist_by_user ON watchlist_items (user_id, added_at);
