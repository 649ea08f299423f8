#!/usr/bin/perl

# Between low_burst and high_burst a check rejects with probability (F-low)/(high-low).

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get status_of);
use Time::HiRes qw(sleep);

my $t = Test::Yarl->new();
$t->run_root('A');
# A negligible drain (0.001/s) keeps F where the test puts it.
$t->put_quota('p', 0.001, 100, 300);
$t->write_file('index.html', "hello\n");
$t->write_http_conf(<<'EOF2', workers => 1);
    yarl_roots %%ROOT_A%%;
    yarl_sync_interval 100ms;
    server {
        listen 127.0.0.1:%%PORT_8080%%;
        root %%TESTDIR%%;
        location /chk/ { alias %%TESTDIR%%/; yarl_check p; }
        location /acct/ { alias %%TESTDIR%%/; yarl_account p $arg_w; }
        location = /stats { yarl_stats; }
    }
EOF2
$t->run();
my $p = $t->port(8080);
ok($t->wait_quota($p, 'p', 5), 'quota arrived');

# The core also suppresses the share of attempted demand above the limit; a
# burst of 200 units at a 0.001/s limit is such demand. Wait until the roots' demand meter
# has seen quiet rounds, so only the zone formula decides: its window is 2 s of whole 250 ms
# buckets, a unit reaches it up to a round after it was counted, and the nginx hears of
# the meter a round later still, so 3 s.
sub quiet { sleep 3 }

sub rejected_fraction {
	my ($n) = @_;
	my $rej = grep { status_of(http_get($p, '/chk/index.html')) == 429 } 1 .. $n;
	return $rej / $n;
}

is(rejected_fraction(200), 0, 'F=0 <= low: nothing rejected');

# F: 0 -> 200 in one request (decided at F=0, so it passes).
is(status_of(http_get($p, '/acct/index.html?w=200')), 200, 'filled to 200');
quiet();
my $f = rejected_fraction(800);
ok(abs($f - 0.5) < 0.08, "F=200: rejected fraction $f close to 0.5");

# F: 200 -> 250; decided in the zone, so retry until it is let through (bounded).
my $ok = 0;
for (1 .. 30) { $ok = 1, last if status_of(http_get($p, '/acct/index.html?w=50')) == 200 }
ok($ok, 'filled to 250');
quiet();
$f = rejected_fraction(800);
ok(abs($f - 0.75) < 0.08, "F=250: rejected fraction $f close to 0.75");

$t->finish();
done_testing();
