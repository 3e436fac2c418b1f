"""§5.1 Training Data: the recipes' corpora, downloaded on first use and verified.

Each file comes from its upstream URL through `keras.utils.get_file` into the
Keras cache (`$KERAS_HOME/datasets/keras_transformer/CORPUS`, by default
`~/.keras/datasets/...`) and is checked against a pinned sha256. A file that
fails the check (a truncated or corrupted download, or a server that changed
the file) is deleted before the error is raised, so a later run never trusts
it; a verified file is used again without the network.

`KERAS_TRANSFORMER_DATA_MIRROR` replaces the scheme and host of every URL: a
mirror holds each file at its upstream URL's path, for example
`$MIRROR/multi30k/dataset/<commit>/data/task1/raw/train.en.gz` and
`$MIRROR/download.tensorflow.org/data/spa-eng.zip`. Any URL that `urllib`
opens works as the mirror (`http://127.0.0.1:8000`, `file:///srv/mirror`).

`fetch_multi30k()` returns the folder of Multi30k's six verified `.gz` files and
`fetch_anki_spa_eng()` the path of the verified `spa-eng/spa.txt`; the tests run
both against a mirror on 127.0.0.1 (`tests/data/test_downloads.py`).
"""

import dataclasses
import hashlib
import os
import shutil
import urllib.parse
import zipfile

from keras_transformer import saving

MIRROR_VARIABLE = "KERAS_TRANSFORMER_DATA_MIRROR"
CACHE_SUBDIR = os.path.join("datasets", "keras_transformer")


class DownloadError(OSError):
    """A corpus could not be downloaded and verified; nothing of it was kept."""


@dataclasses.dataclass(frozen=True)
class RemoteFile:
    """One upstream file.

    Attributes:
        url: Where it is published.
        sha256: The pinned hash of the file, or of `member` for an archive.
        member: For a zip archive, the path inside it of the file to keep.
    """

    url: str
    sha256: str
    member: str = None

    @property
    def name(self):
        """The name the file is kept under in the cache."""
        return os.path.basename(self.member or urllib.parse.urlsplit(self.url).path)


@dataclasses.dataclass(frozen=True)
class Corpus:
    """A set of files kept together in the cache, with its terms of use."""

    name: str
    files: tuple
    terms: str


# The six raw files of Multi30k task 1 at the commit the shared copies come
# from; the hashes are those of the upstream .gz files.
MULTI30K_COMMIT = "a3d2e0d26b56f3846f66a952536ffed4e401d05a"
_MULTI30K_BASE = (f"https://raw.githubusercontent.com/multi30k/dataset/{MULTI30K_COMMIT}/"
                  "data/task1/raw/")
MULTI30K = Corpus(
    name="multi30k",
    files=tuple(RemoteFile(_MULTI30K_BASE + name, sha256) for name, sha256 in (
        ("train.en.gz", "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f"),
        ("train.de.gz", "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6"),
        ("val.en.gz", "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28"),
        ("val.de.gz", "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a"),
        ("test_2016_flickr.en.gz",
         "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9"),
        ("test_2016_flickr.de.gz",
         "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8"),
    )),
    terms=("Multi30k (github.com/multi30k/dataset): for non-commercial research and "
           "educational use; partly derived from Flickr30K. Cite Elliott et al. 2016, "
           "\"Multi30K: Multilingual English-German Image Descriptions\", VL@ACL 2016."),
)

# The archive of the keras.io English-to-Spanish Transformer example. Its
# spa.txt is pinned (the zip itself has no published hash).
ANKI_SPA_ENG = Corpus(
    name="anki-spa-eng",
    files=(RemoteFile("https://storage.googleapis.com/download.tensorflow.org/data/spa-eng.zip",
                      "6ec60e212f812ee3430f7568ea6f33b6fb080e32193c5952e8da0ee8ba45574c",
                      member="spa-eng/spa.txt"),),
    terms=("Tatoeba/Anki English-Spanish pairs (www.manythings.org/anki, release of "
           "2018-05-13): CC-BY 2.0 (France); attribution: \"www.manythings.org/anki and "
           "tatoeba.org\"."),
)


def source_url(url):
    """`url`, or its path under `$KERAS_TRANSFORMER_DATA_MIRROR` when that is set."""
    mirror = os.environ.get(MIRROR_VARIABLE, "").strip()
    if not mirror:
        return url
    if "://" not in mirror:
        raise DownloadError(
            f"{MIRROR_VARIABLE}={mirror!r} is not a URL: give its scheme, for example "
            "http://127.0.0.1:8000 or file:///srv/mirror.")
    return mirror.rstrip("/") + urllib.parse.urlsplit(url).path


def cache_dir(corpus):
    """The folder that holds `corpus`'s verified files."""
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    return os.path.join(home, CACHE_SUBDIR, corpus.name)


def sha256_of(path):
    """The hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(corpus, print_fn=print):
    """Downloads and verifies whatever of `corpus` the cache lacks.

    Args:
        corpus: `MULTI30K` or `ANKI_SPA_ENG` (a `Corpus`).
        print_fn: Where the terms of use go, once, when something is downloaded.

    Returns:
        The cache folder, holding every file of the corpus under its `name`.

    Raises:
        DownloadError: a file could not be fetched or failed its sha256 check;
            what was downloaded of it is deleted.
    """
    directory = cache_dir(corpus)
    missing = [remote for remote in corpus.files if not _verified(directory, remote)]
    if missing:
        print_fn(f"Downloading {corpus.name} ({len(missing)} file(s)) into {directory}. "
                 f"Terms: {corpus.terms}")
    for remote in missing:
        if remote.member:
            _fetch_member(directory, remote)
        else:
            _download(directory, remote.name, remote.url, remote.sha256)
    return directory


def fetch_multi30k(print_fn=print):
    """The folder of the six Multi30k task 1 files (`load_multi30k` reads it)."""
    return fetch(MULTI30K, print_fn)


def fetch_anki_spa_eng(print_fn=print):
    """The path of the Tatoeba/Anki `spa.txt` (`load_tatoeba` reads it)."""
    return os.path.join(fetch(ANKI_SPA_ENG, print_fn), ANKI_SPA_ENG.files[0].name)


def _verified(directory, remote):
    path = os.path.join(directory, remote.name)
    if not os.path.exists(path):
        return False
    if sha256_of(path) == remote.sha256:
        return True
    os.remove(path)  # damaged or changed: fetch it again
    return False


def _download(directory, name, url, sha256):
    """`keras.utils.get_file` of `url` into `directory`, checked against `sha256`
    when given; returns the file's path."""
    from keras.utils import get_file

    url = source_url(url)
    path = os.path.join(directory, name)
    os.makedirs(directory, exist_ok=True)
    if not os.access(directory, os.W_OK):
        raise DownloadError(f"Cannot write to {directory}: set KERAS_HOME to a writable "
                            "folder, or pass a local copy (--data-dir / --data).")
    try:
        get_file(name, url, file_hash=sha256, hash_algorithm="sha256", cache_dir=directory,
                 cache_subdir="")
    except ValueError as error:  # get_file's hash check, which keeps the file
        found = _describe(path)
        _remove(path)
        raise DownloadError(
            f"{url} gave a file that is not the expected one ({found}; expected sha256 "
            f"{sha256}): the download was truncated or corrupted, or the server holds a "
            "different version. Nothing was kept; run again to retry, or pass a local copy "
            "(--data-dir / --data).") from error
    except Exception as error:  # noqa: BLE001  get_file wraps every network error in Exception
        _remove(path)
        raise DownloadError(
            f"Cannot download {url}: {error}. Nothing was kept; check the network (or "
            f"{MIRROR_VARIABLE}), or pass a local copy (--data-dir / --data).") from error
    return path


def _fetch_member(directory, remote):
    """Downloads the archive, keeps `remote.member` if its sha256 matches, and
    deletes the archive either way."""
    archive_name = os.path.basename(urllib.parse.urlsplit(remote.url).path)
    archive = _download(directory, archive_name, remote.url, None)
    target = os.path.join(directory, remote.name)
    try:
        with saving.atomic_path(target) as partial:
            try:
                with zipfile.ZipFile(archive) as zipped, zipped.open(remote.member) as source, \
                        open(partial, "wb") as output:
                    shutil.copyfileobj(source, output)
            except (zipfile.BadZipFile, KeyError, EOFError, OSError) as error:
                raise DownloadError(
                    f"{source_url(remote.url)} is not a zip archive holding {remote.member} "
                    f"({type(error).__name__}: {error}): the download was truncated or "
                    "corrupted. Nothing was kept; run again to retry, or pass a local copy "
                    "(--data).") from error
            found = sha256_of(partial)
            if found != remote.sha256:
                raise DownloadError(
                    f"{remote.member} in {source_url(remote.url)} has sha256 {found}, not the "
                    f"pinned {remote.sha256}: the archive is corrupted or a different "
                    "release. Nothing was kept; run again to retry, or pass a local copy "
                    "(--data).")
    finally:
        _remove(archive)


def _describe(path):
    if not os.path.exists(path):
        return "no file"
    return f"{os.path.getsize(path):,} bytes, sha256 {sha256_of(path)}"


def _remove(path):
    if os.path.exists(path):
        os.remove(path)
