"""The Triton model repository's templates (configs, python-backend code, model cards), shipped inside the
package so that an installed modpipe serves without a checkout. `modpipe.serving.repository` assembles a
runnable repository from these and a model build; nothing here is imported by the models themselves."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent
