-- A number that grows with every change to the catalogue (movies, their moods, TV shows,
-- reviews), so that servers can keep what they read of it in memory and know when to read again.
CREATE TABLE catalogue_version (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version BIGINT NOT NULL
);
INSERT INTO catalogue_version (id, version) VALUES (1, 0);

CREATE FUNCTION bump_catalogue_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE catalogue_version SET version = version + 1;
    RETURN NULL;
END
$$;

CREATE TRIGGER movies_bumps_version AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON movies
    FOR EACH STATEMENT EXECUTE FUNCTION bump_catalogue_version();
CREATE TRIGGER movie_moods_bumps_version AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON movie_moods
    FOR EACH STATEMENT EXECUTE FUNCTION bump_catalogue_version();
CREATE TRIGGER tv_shows_bumps_version AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON tv_shows
    FOR EACH STATEMENT EXECUTE FUNCTION bump_catalogue_version();
CREATE TRIGGER reviews_bumps_version AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON reviews
    FOR EACH STATEMENT EXECUTE FUNCTION bump_catalogue_version();
