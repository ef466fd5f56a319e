"""The local stack behind `modpipe up`, smoke, the demo and the tests: the broker, Triton and N workers as
child processes (`stack.py`)."""
