#!/usr/bin/perl

# Cluster-wide reset: POST /v1/quotas/{name}:reset on one root empties the quota's counter
# on both roots (one database) and in both nginx (two workers each) within two sync
# intervals, requests pass again, and what the nginx counted just before the reset (deltas
# not yet synced, and those on their way) does not come back afterwards. The same for one
# key under a template (no row of its own), while another key of the template keeps its
# count.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get status_of);
use Time::HiRes qw(time sleep);

my $INTERVAL = 0.5;

my $http = <<'EOF2';
    yarl_roots %%ROOT_A%% %%ROOT_B%%;
    yarl_sync_interval 500ms;
    # Early rounds would send the counts made just before a reset ahead of it.
    yarl_sync_early off;
    server {
        listen 127.0.0.1:%%PORT_8080%% reuseport;
        root %%TESTDIR%%;
        location / {
            yarl_account q;
        }
        location /k/ {
            alias %%TESTDIR%%/;
            yarl_account api_key_$arg_k;
        }
        location = /stats {
            access_log off;
            yarl_stats;
        }
    }
EOF2

my $t = Test::Yarl->new();
$t->run_root('A');
$t->run_root('B', '--db', 'sqlite://' . $t->testdir . '/yarl_A.db');
my $u = Test::Yarl->new()->use_roots_of($t);
my @nginx = ($t, $u);
for my $n (@nginx) {
	$n->write_file('index.html', "hello\n");
	$n->write_http_conf($http, workers => 2);
	$n->run();
}

# 1/s: the counter barely drains during the test, so what is left is what was counted.
$t->put_quota($_, 1, 40, 60) for 'q', 'api_key_*';
for my $n (@nginx) {
	ok($n->wait_quota($n->port(8080), 'api_key_*', 5), 'nginx ' . ($n == $t ? 1 : 2) . ' fetched the quotas');
}

# What is reset (a quota's name or a key's) and a request it counts.
our ($NAME, $PATH);

sub burst {
	my ($n, $count, $path) = @_;
	my %st;
	$st{status_of(http_get($n->port(8080), $path // $PATH))}++ for 1 .. $count;
	return \%st;
}

sub nginx_fill {
	my ($n) = @_;
	my $s = $n->stats($n->port(8080), "/stats?quota=$NAME") or return undef;
	return $s->{quota} ? $s->{quota}{fill} : undef;
}

sub root_fill {
	my ($root, $name) = @_;
	my ($status, $q) = $t->admin('GET', '/v1/quotas/' . ($name // $NAME), undef, $root);
	return undef unless $status == 200 && ref $q;
	return $q->{counter} ? $q->{counter}{fill} : 0;
}

my %view = (
	'root A' => sub { root_fill('A') },
	'root B' => sub { root_fill('B') },
	'nginx 1' => sub { nginx_fill($t) },
	'nginx 2' => sub { nginx_fill($u) },
);

# When each view reads an empty bucket (fill below one unit: it only grows by 1/s of drain
# and nothing is sent meanwhile), in seconds after $t0.
sub timeline {
	my ($t0) = @_;
	my %when;
	$t->wait_for(sub {
		for my $k (keys %view) {
			next if exists $when{$k};
			my $f = $view{$k}->();
			$when{$k} = time() - $t0 if defined $f && $f < 1;
		}
		return keys %when == keys %view;
	}, 4 * $INTERVAL);
	return \%when;
}

sub reset_quota {
	my ($status, $body) = $t->admin('POST', "/v1/quotas/$NAME:reset");
	is($status, 200, "POST /v1/quotas/$NAME:reset");
	ok(ref $body && $body->{reset_epoch} && $body->{reset_epoch} == $body->{epoch},
		'the answer carries the reset epoch');
}

for my $case (['q', '/index.html'], ['api_key_abc', '/k/index.html?k=abc']) {
	($NAME, $PATH) = @$case;
	note("reset of $NAME");
	reset_case($NAME eq 'q' ? 1 : 2);
}

sub reset_case {
	my ($case) = @_;

	# Fill the bucket from both nginx until every view sees it well above low_burst (40). A
	# key new to each nginx counts for both at first, so fewer of its first requests pass, and
	# each nginx adds a guess of the other's inflow to what it counts, so it may refuse while
	# the roots hold less: top up until every view (both nginx, both roots) sees it full.
	# What each round saw and got, told if the bucket never looks full.
	my $fills = sub { join(', ', map { sprintf('%s %.1f', $_, $view{$_}->() // -1) } sort keys %view) };
	my $answers = sub {
		my ($count) = @_;
		return join(' ', map {
			my $st = burst($_, $count);
			join(',', map { "$_:$st->{$_}" } sort keys %$st);
		} @nginx);
	};
	my @rounds = ($answers->(40));
	for (1 .. 10) {
		last if $t->wait_for(sub { !grep { ($_->() // 0) <= 50 } values %view }, 2 * $INTERVAL);
		push @rounds, $fills->() . ' then ' . $answers->(20);
	}
	ok((nginx_fill($t) // 0) > 50 && (nginx_fill($u) // 0) > 50, 'both nginx see the bucket full')
		or diag('fills and answers by round: ' . join('; ', @rounds) . '; now ' . $fills->());
	ok($t->wait_for(sub { (root_fill('A') // 0) > 50 && (root_fill('B') // 0) > 50 }, 3),
		'both roots see the bucket full')
		or diag('now ' . $fills->() . '; by round: ' . join('; ', @rounds));
	# Another key of the template gets a few units that its neighbour's reset leaves alone.
	burst($t, 8, '/k/index.html?k=other');
	ok($t->wait_for(sub { (root_fill('A', 'api_key_other') // 0) > 7 }, 3), 'another key counted');
	my ($other, $other_at) = (root_fill('A', 'api_key_other'), time());
	# Between low_burst and high_burst a request passes at random: ask until both refuse.
	ok($t->wait_for(sub {
		join(',', map { status_of(http_get($_->port(8080), $PATH)) } @nginx) eq '429,429';
	}, 3), 'both nginx refuse');

	my $t0 = time();
	reset_quota();
	my $when = timeline($t0);
	for my $k (sort keys %view) {
		my $w = $when->{$k};
		diag(sprintf('%-7s empty at +%s', $k, defined $w ? sprintf('%.3f s', $w) : 'never'));
		# Each poll of the timeline makes four calls; 0.3 s for them on a loaded machine,
		# under a third interval.
		ok(defined $w && $w <= 2 * $INTERVAL + 0.3, "$k empty within two intervals");
	}
	is_deeply([map { status_of(http_get($_->port(8080), $PATH)) } @nginx], [200, 200],
		'both nginx pass again');
	# It only drains (1/s) meanwhile.
	my $drained = $other - (time() - $other_at) - 0.5;
	ok((root_fill('A', 'api_key_other') // 0) > $drained,
		"another key keeps its count after ${NAME}'s reset");

	# Counts made just before a reset, admitted and not yet synced when it is written: they
	# reach the roots after it, tagged with the epoch they were counted at, and are dropped.
	my @before = map { burst($_, 15) } @nginx;
	$t0 = time();
	reset_quota();
	is_deeply([map { $_->{200} // 0 } @before], [15, 15], 'the counts just before were admitted');
	$when = timeline($t0);
	diag('second reset: ' . join(', ', map { sprintf('%s +%.3f s', $_, $when->{$_} // -1) } sort keys %view));
	is(scalar keys %$when, 4, 'every view empty again');

	# Nothing counted before the reset comes back: watch three intervals more.
	my $max = 0;
	my $end = time() + 3 * $INTERVAL;
	while (time() < $end) {
		for my $f (map { $_->() } values %view) {
			$max = $f if defined $f && $f > $max;
		}
		sleep 0.05;
	}
	diag(sprintf('largest fill anywhere over the next %.1f s: %.3f', 3 * $INTERVAL, $max));
	cmp_ok($max, '<', 1, 'old counts do not come back through late deltas or hints');

	is_deeply([map { status_of(http_get($_->port(8080), $PATH)) } @nginx], [200, 200],
		'both nginx pass');
	# Five units from each nginx in all. The two reach a root up to an interval apart, while it
	# drains 1/s: with one unit each, the peak could be as low as 1.5 and a poll could miss it.
	is_deeply([map { burst($_, 4)->{200} // 0 } @nginx], [4, 4], 'four more each, admitted');
	ok($t->wait_for(sub { (root_fill('A') // 0) >= 5 && (root_fill('B') // 0) >= 5 }, 3),
		'counting goes on after the reset');

	my %a = %{$t->root_metrics('A')};
	my %b = %{$t->root_metrics('B')};
	is($b{yarl_root_resets_total}, 2 * $case, 'root B applied both resets it polled');
	diag('deltas dropped as counted before a reset: root A ' . ($a{yarl_root_dropped_before_reset_total} // '?')
		. ', root B ' . ($b{yarl_root_dropped_before_reset_total} // '?'));
}

$u->finish();
$t->finish();
done_testing();
