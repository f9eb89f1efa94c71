from shardmd.engine.x import hello
