-- A number that grows with every change to the catalogue (movies, their moods, TV shows,
-- reviews), so that servers can keep what they read of it in memory and know when to read again.
CREATE TABLE catalogue_version (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version BIGINT NOT NULL
);
INSERT INTO catalogue_version (id, version) VALUES (1, 0);

CREATE TRIGGER movies_insert_bumps_version AFTER INSERT ON movies
BEGIN UPDATE catalogue_version SET version = version + 1; END;
CREATE TRIGGER movies_update_bumps_version AFTER UPDATE ON movies
BEGIN UPDATE catalogue_version SET version = version + 1; END;
CREATE TRIGGER movies_delete_bumps_version AFTER DELETE ON movies
BEGIN UPDATE catalogue_version SET version = version + 1; END;
CREATE TRIGGER movie_moods_insert_bumps_version AFTER INSERT ON movie_moods
BEGIN UPDATE catalogue_version SET version = version + 1; END;
CREATE TRIGGER movie_moods_update_bumps_version AFTER UPDATE ON movie_moods
BEGIN UPDATE catalogue_version SET version = version + 1; END;
CREATE TRIGGER movie_moods_delete_bumps_version AFTER DELETE ON movie_moods
BEGIN UPDATE catalogue_version SET version = version + 1; END;
CREATE TRIGGER tv_shows_insert_bumps_version AFTER INSERT ON tv_shows
BEGIN UPDATE catalogue_version SET version = version + 1; END;
CREATE TRIGGER tv_shows_update_bumps_version AFTER UPDATE ON tv_shows
BEGIN UPDATE catalogue_version SET version = version + 1; END;
CREATE TRIGGER tv_shows_delete_bumps_version AFTER DELETE ON tv_shows
BEGIN UPDATE catalogue_version SET version = version + 1; END;
CREATE TRIGGER reviews_insert_bumps_version AFTER INSERT ON reviews
BEGIN UPDATE catalogue_version SET version = version + 1; END;
CREATE TRIGGER reviews_update_bumps_version AFTER UPDATE ON reviews
BEGIN UPDATE catalogue_version SET version = version + 1; END;
CREATE TRIGGER reviews_delete_bumps_version AFTER DELETE ON reviews
BEGIN UPDATE catalogue_version SET version = version + 1; END;
