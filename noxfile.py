"""Developer sessions: ``nox -s tests lint typecheck docs``, each installing the project."""

import nox

nox.options.sessions = ["tests", "lint", "typecheck", "docs"]
nox.options.default_venv_backend = "venv"


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite, exactly as the README and CI run it."""
    session.install("-e", ".[dev]")
    session.run("python", "-m", "pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """Ruff lint and format check over the whole tree."""
    session.install("ruff>=0.17")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """Pyright on the package, with the stubs in typings/."""
    session.install("-e", ".[dev]")
    session.run("pyright", "src")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the Sphinx docs with warnings as errors."""
    session.install("-e", ".[docs,testing]")  # the API pages import nnx_ppo.testing
    session.run("sphinx-build", "-W", "--keep-going", "-b", "html", "docs", "docs/_build/html")
