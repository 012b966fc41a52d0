"""Browser tests: JupyterLab and the export in headless Chromium."""


def attach_cell(server, name: str = "live") -> str:
    """The attach notebook's first cell: follow the test server's feed and show the Dashboard."""
    return ("from explorer import Session, Dashboard\n"
            f"{name} = Session.attach({server.feed!r}, snapshot_address={server.snapshots!r})\n"
            f"{name}.follow()\n"
            f"Dashboard({name})")
