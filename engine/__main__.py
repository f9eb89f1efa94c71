import sys; from shardmd.engine.x import hello; print(hello(), __name__, __file__)
