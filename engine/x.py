def hello(): return "hi"
