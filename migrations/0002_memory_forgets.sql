-- 0002: forgetting memories. A forget message deletes memories by id; its
-- tombstone keeps an older, late-arriving copy of the memory (redelivered, or
-- written by another worker out of order) from coming back.
CREATE TABLE bb_memory_forgets (
    id     text   NOT NULL,
    board  text   NOT NULL,
    stream text   NOT NULL,
    seq    bigint NOT NULL,
    PRIMARY KEY (id, board)
);
